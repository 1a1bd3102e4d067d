#include "perf/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include "comm/grid_layout.hpp"
#include "core/error.hpp"
#include "parallel/pp/schedule.hpp"
#include "parallel/pp/stage_layers.hpp"
#include "perf/activation_memory.hpp"
#include "perf/compute_model.hpp"
#include "perf/memory.hpp"
#include "perf/tessera_memory.hpp"

namespace tessera {

const char* runtime_name(Runtime r) {
  return r == Runtime::megatron ? "megatron" : "tessera";
}

Runtime parse_runtime(const std::string& s) {
  if (s == "megatron") return Runtime::megatron;
  if (s == "tessera") return Runtime::tessera;
  TESSERA_REQUIRE(false, "runtime '", s, "' is not megatron or tessera");
  return Runtime::megatron;
}

namespace {

double layer_params_per_rank(const Workload& w, const Layout& l) {
  const ModelConfig& c = w.cfg;
  const double t = l.tp, C = double(c.d_model);
  const double q = double(c.heads * c.head_dim) / t;
  const double kv = double(std::max<int64_t>(1, c.kv_heads / l.tp) * c.head_dim);
  const bool bias = c.has_bias(), gated = c.arch == Arch::llama;
  double n = 2 * C * q + 2 * C * kv + (bias ? q + 2 * kv + C : 0);  // attention
  n += 2 * C * (bias ? 2 : 1);                                      // norms
  const double mats = gated ? 3 : 2;
  if (w.moe.any()) {
    const double Fe = double(w.moe.expert_ffn ? w.moe.expert_ffn : c.ffn_hidden) / t;
    n += double(w.moe.experts) / l.ep * mats * C * Fe + C * w.moe.experts;
  } else {
    const double F = double(c.ffn_hidden) / t;
    n += mats * C * F + (bias ? F + C : 0);
  }
  return n;
}

// DualPipe's interleaved pairs (parallel/pp/paired_overlap.hpp, model/pass_pair.hpp): a pair
// runs one micro-batch's forward and another's backward_input together, each giving way at its
// all-to-alls, so the forward's dispatch and combine (two of a layer's four) travel behind the
// B's compute and the B's two behind the forward's, each up to that compute's time:
// min(comm, compute). A pair's passes are chunks of Lp / v layers (Lp: the pacing stage's); B
// is half the backward (F = B = W, as the bubble formula takes it); ep: a layer's all-to-all
// seconds per micro-batch. The pairs per step are those of the stage with the fewest
// (pp::op_pairs on its op list), returned in `pairs`. Returns the seconds hidden per step.
double paired_ep_hidden(const Layout& l, int64_t m, double Lp, double ep, const LayerCompute& lc,
                        double& pairs) {
  const pp::ScheduleShape shape{l.pp, int(m), l.vpp, l.schedule};
  const pp::Schedule sched = pp::make_schedule(shape);
  pairs = -1;
  for (const std::vector<pp::Op>& ops : sched.stages) {
    const double n = double(pp::op_pairs(shape, ops).size());
    pairs = pairs < 0 ? n : std::min(pairs, n);
  }
  const double chunk = Lp / l.vpp, comm = chunk * ep / 2;
  const double fwd = chunk * lc.forward(), bwd_input = chunk * lc.backward() / 2;
  return pairs * (std::min(comm, bwd_input) + std::min(comm, fwd));
}

}  // namespace

StageLayers stage_layer_counts(const Workload& w, const Layout& l) {
  const ModelConfig& c = w.cfg;
  const int chunks = l.pp * l.vpp;
  StageLayers s;
  if (l.pp == 1 || (c.layers % chunks == 0 && w.pp_layers == "balanced")) {
    s.first = s.last = s.most = s.end = double(c.layers) / l.pp;
    return s;
  }
  const std::vector<int64_t> sizes = pp::split_layers(c, chunks, w.pp_layers);
  // A Layout spells interleaved as 1f1b with vpp > 1; the micro-batches do not place chunks.
  const pp::ScheduleShape shape{l.pp, 1, l.vpp, l.run_schedule()};
  for (int stage = 0; stage < l.pp; ++stage) {
    double n = 0;
    for (const ChunkLayers& ch : pp::stage_layers(sizes, shape, stage))
      n += double(ch.last - ch.first);
    if (stage == 0) s.first = n;
    if (stage == shape.loss_stage()) s.last = n;
    if (stage == l.pp - 1) s.end = n;
    s.most = std::max(s.most, n);
  }
  return s;
}

StageParams stage_params(const Workload& w, const Layout& l) {
  return stage_params(w, l, stage_layer_counts(w, l));
}

StageParams stage_params(const Workload& w, const Layout& l, const StageLayers& cut) {
  const ModelConfig& c = w.cfg;
  const double C = double(c.d_model);
  const double per_layer = layer_params_per_rank(w, l);
  const double embed =
      double(c.vocab_padded) * C / l.tp + (c.arch == Arch::gpt2 ? double(c.seq_len) * C : 0);
  const double final_norm = C * (c.has_bias() ? 2 : 1);
  // The output head: its own matrix, or with tied embeddings a copy of the embedding on the
  // last stage when that is not the first (Megatron keeps both and all-reduces their grads).
  const double head = c.tie_embeddings && l.pp == 1 ? 0 : double(c.vocab_padded) * C / l.tp;
  StageParams s;
  double expert_layer = 0;  // one layer's routed experts per rank
  if (w.moe.any()) {
    const double Fe = double(w.moe.expert_ffn ? w.moe.expert_ffn : c.ffn_hidden) / l.tp;
    expert_layer = double(w.moe.experts) / l.ep * (c.arch == Arch::llama ? 3 : 2) * C * Fe;
  }
  s.experts = cut.first * expert_layer;
  // A V placement (zb-v, dualpipev) puts the first and the last model chunk on stage 0: the
  // embedding and the head on one stage (with tied embeddings one table, no copy).
  const bool v_shape = l.pp > 1 && pp::placement_of(l.schedule) == pp::Placement::v_shape;
  const bool together = l.pp == 1 || v_shape;
  const double own_head = c.tie_embeddings && together ? 0 : double(c.vocab_padded) * C / l.tp;
  s.first = cut.first * per_layer + embed + (together ? final_norm + own_head : 0);
  s.last = together ? s.first : cut.last * per_layer + final_norm + head;
  s.end = v_shape ? cut.end * per_layer : s.last;
  s.end_experts = v_shape ? cut.end * expert_layer : s.experts;
  return s;
}

// Runtime tessera with node-limited routing or the two-level dispatch: the nodes the ep group
// spans on the cluster stand in for parallel.ep_nodes when the deck leaves it 0 (as
// ProcessGrid::blocked_nodes finds them at run time; 0 when the group is not in equal blocks,
// which tessera refuses). links: the layout's, when the caller has them. Returns w itself
// when nothing changes (the search calls this for every layout: no copy then), else the copy
// it makes in `placed`.
const Workload& placed_workload(const Workload& w, const Layout& l, const Cluster& cl,
                                std::optional<Workload>& placed,
                                const GroupLinks* links = nullptr) {
  if (w.ep_nodes > 0 || (w.ep_dispatch != EpDispatch::two_level && w.ep_max_nodes == 0)) return w;
  try {
    const GroupPlacement g = (links ? *links : group_links(l, cl)).ep.place;
    placed.emplace(w).ep_nodes = g.per_node_max == g.per_node_min ? g.nodes : 0;
  } catch (const Error&) {
    return w;  // a layout the grid refuses (its rank order): layout_problem says why
  }
  return *placed;
}

std::string layout_problem(const Workload& given, const Layout& l, const Cluster& cl, Runtime rt,
                           int accelerators) {
  std::optional<Workload> placed;
  const Workload& w = placed_workload(given, l, cl, placed);
  const ModelConfig& c = w.cfg;
  if (l.accelerators() != accelerators)
    return cat("dp x tp x pp x cp = ", l.accelerators(), " is not the ", accelerators,
               " accelerators asked for");
  if (cl.nodes > 0 && accelerators > cl.nodes * cl.per_node)
    return cat("the cluster has ", cl.nodes * cl.per_node, " accelerators, not ", accelerators);
  if (c.heads % l.tp != 0) return cat("tp = ", l.tp, " does not divide the ", c.heads, " heads");
  if (c.kv_heads % l.tp != 0 && l.tp % c.kv_heads != 0)
    return cat("tp = ", l.tp, " and the ", c.kv_heads, " key/value heads do not divide each other");
  if (c.ffn_hidden % l.tp != 0)
    return cat("tp = ", l.tp, " does not divide the MLP hidden size ", c.ffn_hidden);
  // Layers that do not split evenly into p x v chunks are cut as tessera's runtime cuts
  // them (stage_layer_counts); every chunk needs at least one layer.
  if (c.layers < int64_t(l.pp) * l.vpp)
    return cat("pp x v = ", l.pp * l.vpp, " leaves a chunk without layers (", c.layers, " layers)");
  try {
    GridLayout({l.tp, l.cp, l.ep, l.dp, l.pp}, l.order, l.accelerators());
  } catch (const Error& e) {
    return cat("order = ", l.order, ": ", e.what());
  }
  if (l.recompute_layers > 0 && l.recompute != Recompute::full)
    return "rc=full:N needs full recompute";
  if (l.vpp > 1 && l.pp == 1) return "v > 1 (interleaving) needs pp > 1";
  if (l.vpp > 1 && l.schedule == PipeSchedule::gpipe) return "v > 1 needs the 1F1B schedule";
  if (pp::splits_backward(l.schedule)) {
    if (l.pp == 1) return cat("sched = ", to_string(l.schedule), " needs pp > 1");
    const int64_t per = int64_t(l.micro_batch) * l.dp;
    try {
      pp::require_valid({l.pp,
                         int(std::max<int64_t>(1, w.global_batch / std::max<int64_t>(1, per))),
                         l.vpp, l.schedule});
    } catch (const Error& e) {
      return e.what();
    }
  }
  if (c.seq_len % l.cp != 0) return cat("cp = ", l.cp, " does not divide seq_len ", c.seq_len);
  if (l.ep > 1 && !w.moe.any()) return "ep > 1 needs a mixture-of-experts model (--experts)";
  if (w.moe.any() && w.moe.experts % l.ep != 0)
    return cat("ep = ", l.ep, " does not divide the ", w.moe.experts, " experts");
  if (l.dp % l.ep != 0)
    return cat("ep = ", l.ep, " does not divide dp = ", l.dp, " (EP folds into DP)");
  if (l.seq_parallel && l.tp == 1) return "sequence parallelism needs tp > 1";
  if (l.shard_group > 0 && (l.zero == 0 || (l.dp * l.cp) % l.shard_group != 0))
    return cat("hsdp = ", l.shard_group,
               " needs zero >= 1 and must divide dp x cp = ", l.dp * l.cp);
  // ZeRO-2/3 with a pipeline: the sharded gradients are reduce-scattered every micro-batch
  // (and ZeRO-3's parameters gathered every micro-batch); costed as such (overlap.hpp).
  const int64_t m = microbatches(w, l);
  if (m == 0)
    return cat("the global batch ", w.global_batch,
               " is not a multiple of dp x mb = ", l.dp * l.micro_batch);
  if (l.vpp > 1 && m % l.pp != 0)
    return cat("interleaving needs micro-batches (", m, ") to be a multiple of pp = ", l.pp);
  if (rt == Runtime::tessera) {
    if (l.precision == ComputeType::fp8) return "tessera trains in fp32, bf16 or fp16";
    // Every check tessera makes of a run's layout (RankLayout::make; the same on every rank).
    try {
      (void)tessera_rank_layout(w, l, 0);
    } catch (const Error& e) {
      return e.what();
    }
    if (l.order != Layout::kDefaultRankOrder)
      return cat("the planner validates tessera's memory for the default rank order only (order = ",
                 l.order, ")");
  }
  (void)cl.peak(l.precision);  // throws when the accelerator lacks this precision
  return {};
}

Estimate estimate(const Workload& given, const Layout& l, const Cluster& cl, Runtime rt,
                  const GroupLinks* links, const StageLayers* cut) {
  Estimate e;
  e.links = links ? *links : group_links(l, cl);
  std::optional<Workload> placed;
  const Workload& w = placed_workload(given, l, cl, placed, &e.links);
  const ModelConfig& c = w.cfg;
  e.layout = l;
  e.runtime = rt;
  e.microbatches = microbatches(w, l);
  e.capacity = cl.memory;
  const int64_t m = e.microbatches;
  e.stage_layers = cut ? *cut : stage_layer_counts(w, l);
  // Ls: layers of the fullest stage, which sets the pipeline's pace.
  const double M = double(m), p = l.pp, L = double(c.layers), Ls = e.stage_layers.most;
  const int N = l.shard_ranks();
  const bool moe = w.moe.any();

  // ---- memory ----
  const StageParams sp = stage_params(w, l, e.stage_layers);
  const double a = activation_element_bytes(l);
  const double T = double(l.micro_batch) * double(c.seq_len) / l.cp;
  const double C = double(c.d_model);
  const LayerActivations act = layer_activations(w, l, moe);
  double reported_layers = e.stage_layers.first;  // layers of the stage whose memory is reported
  // Full recompute of N of a stage's layers (rc=full:N): those keep their input only.
  auto saved_on = [&](double stage_layers) {
    const double n = l.recomputed_layers(stage_layers);
    const Recompute others = l.recompute == Recompute::full ? Recompute::none : l.recompute;
    return n * saved_bytes_per_layer(act, Recompute::full) +
           (stage_layers - n) * saved_bytes_per_layer(act, others);
  };
  // A split-backward schedule in a GPU framework (doc/planning.md, "Split-backward schedules
  // under --runtime megatron"): each chunk pass keeps its activations from F to W, and from B
  // to W the output gradients of its weight GEMMs (and, under full recompute, what B rebuilt).
  auto pending_on = [&](double stage_layers) {
    return stage_layers * weight_grad_pending_bytes_per_layer(w, l, moe) +
           l.recomputed_layers(stage_layers) * (act.total() - act.input);
  };
  const bool split = l.pp > 1 && pp::splits_backward(l.schedule);
  if (rt == Runtime::tessera && l.pp > 1) {
    const TesseraStageMemory sm = tessera_pipeline_memory(w, l, m);
    e.memory = sm.memory;
    e.params_per_rank = sm.params;
  } else if (rt == Runtime::tessera) {
    // What the layout means for a rank (all ranks alike without a pipeline).
    const RankLayout r = tessera_rank_layout(w, l, 0);
    const ModelConfig& tc = r.model;
    const double psi = r.params;
    const ModelStateBytes s = r.model_state();
    e.params_per_rank = psi;
    e.memory.params = s.params;
    e.memory.grads = s.grads;
    e.memory.optimizer = s.optimizer;
    e.memory.activations = activation_bytes(tc, l.micro_batch);
    e.memory.workspace = tessera_workspace_bytes(tc, l.micro_batch, tessera_half(l)) +
                         tessera_document_bytes(w, tc, l.micro_batch, 1);
    e.memory.comm = tessera_comm_bytes(r, l, m, w.zero_inflight) +
                    tessera_grad_staging_bytes(l, psi) +
                    double(tc.moe_blocks()) * moe_two_level_comm_bytes(tc, l.micro_batch);
  } else {
    // Stage `stage` holding the embedding (first), the head (last), psi parameters per TP rank
    // of which `experts` are routed experts' weights, and `here` layers.
    auto stage_memory = [&](int stage, bool first, bool last, double psi, double experts,
                            double here) {
      MemoryBreakdown mb;
      // Expert weights are replicated over dp x cp / ep ranks only, so ZeRO shards them over
      // that many (Megatron-LM's expert-data-parallel group).
      const ModelStateBytes s = zero_model_state(l.zero, psi - experts, N, l.mixed());
      const ModelStateBytes x =
          zero_model_state(l.zero, experts, double(expert_shard_ranks_of(N, l.ep)), l.mixed());
      mb.params = s.params + x.params, mb.grads = s.grads + x.grads;
      mb.optimizer = s.optimizer + x.optimizer;
      // Micro-batches in flight on this stage (in stage activations): first stage p (1F1B),
      // last stage 1; a split kind holds pp::peak_activations_formula chunk passes (zb-h1 p,
      // zb-v 2p, dualpipev 2p + 1 chunks of 1/v of the stage), of which
      // pp::peak_pending_weights_formula wait for W with their output gradients.
      const double even = L / p;
      double in_flight = l.pp == 1 ? 1
                         : first   ? inflight_layer_equivalents(l, c.layers, m) / even
                                   : (l.schedule == PipeSchedule::gpipe ? M : 1);
      double pending = 0;
      if (split) {
        const pp::ScheduleShape shape{l.pp, int(m), l.vpp, l.schedule};
        in_flight = double(pp::peak_activations_formula(shape, stage)) / l.vpp;
        pending = double(pp::peak_pending_weights_formula(shape, stage)) / l.vpp;
      }
      mb.activations = in_flight * saved_on(here) + pending * pending_on(here);
      if (l.recomputed_layers(here) > 0) mb.activations += act.total();  // one layer rebuilt
      const double stream = a * T * C / (l.seq_parallel ? l.tp : 1);
      if (first)
        mb.activations +=
            in_flight * (stream + (w.dropout ? T * C / (l.seq_parallel ? l.tp : 1) : 0));
      if (last) mb.activations += stream + 4 * T * double(c.vocab_padded) / l.tp;  // fp32 logits
      // Communication buffers.
      const double wb = l.mixed() ? 2 : 4;
      double lp = 0;
      {
        Layout one = l;
        one.pp = 1;
        Workload w1 = w;
        w1.cfg.layers = 1;
        const StageParams s1 = stage_params(w1, one);
        Workload w0 = w;
        w0.cfg.layers = 0;
        lp = s1.first - stage_params(w0, one).first;  // one layer's parameters per TP rank
      }
      if (l.pp > 1) mb.comm += 2 * a * T * C / l.tp * 2;  // send and receive, both directions
      if (l.zero == 3) mb.comm += 2 * wb * lp;            // gathered layer and the prefetched one
      if (l.zero >= 2) mb.comm += 2 * wb * lp;            // gradient staging, two layers
      if (l.cp > 1) {
        const double kv = double(std::max<int64_t>(1, c.kv_heads / l.tp) * c.head_dim);
        mb.comm += 2 * 2 * a * T * kv;
      }
      if (moe && l.ep > 1) mb.comm += 2 * a * T * w.moe.top_k * C;
      // Workspace: two gradients of the widest activation of a layer.
      const double q = double(c.heads * c.head_dim) / l.tp;
      const double F =
          double(moe ? w.moe.top_k * (w.moe.expert_ffn ? w.moe.expert_ffn : c.ffn_hidden)
                     : c.ffn_hidden) /
          l.tp;
      mb.workspace = 2 * a * T * std::max({C, 3 * q, (c.arch == Arch::llama ? 2 : 1) * F});
      mb.reserved = cl.reserved;
      return mb;
    };
    // The first and the last stage; with a V placement stage 0 holds the embedding and the
    // head, and stage p-1 only layers.
    const StageLayers& cut_ = e.stage_layers;
    const bool v_shape = split && pp::placement_of(l.schedule) == pp::Placement::v_shape;
    const MemoryBreakdown f =
        stage_memory(0, true, l.pp == 1 || v_shape, sp.first, sp.experts, cut_.first);
    const MemoryBreakdown g =
        v_shape ? stage_memory(l.pp - 1, false, false, sp.end, sp.end_experts, cut_.end)
                : stage_memory(l.pp - 1, l.pp == 1, true, sp.last, sp.experts,
                               l.pp == 1 ? cut_.first : cut_.last);
    const bool use_first = f.total() >= g.total();
    e.memory = use_first ? f : g;
    e.params_per_rank = use_first ? sp.first : v_shape ? sp.end : sp.last;
    reported_layers = use_first ? cut_.first : v_shape ? cut_.end : cut_.last;
  }

  // ---- time ----
  const LayerCompute lc = layer_compute(w, l, cl, moe);
  const HeadCompute hc = head_compute(w, l, cl);
  // Per layer, averaged over the stage's layers when only N of them are fully recomputed.
  Layout plain = l;
  plain.recompute = l.recompute == Recompute::full ? Recompute::none : l.recompute;
  plain.recompute_layers = 0;
  const double share = Ls > 0 ? l.recomputed_layers(Ls) / Ls : 0;  // fully recomputed
  auto per_layer = [&](auto&& f) {
    return l.recompute == Recompute::full ? share * f(l) + (1 - share) * f(plain) : f(l);
  };
  const double tp =
      per_layer([&](const Layout& x) { return tp_seconds_per_layer(w, x, e.links.tp); });
  const double cp = per_layer([&](const Layout& x) {
    if (w.cp_kind == CpKind::ulysses) return cp_seconds_per_layer(w, x, e.links.cp);
    const double attn =
        lc.attn_fwd + lc.attn_bwd + (x.recompute != Recompute::none ? lc.attn_fwd : 0);
    return std::max(0.0, cp_seconds_per_layer(w, x, e.links.cp) - attn);
  });
  const double ep =
      per_layer([&](const Layout& x) { return ep_seconds_per_layer(w, x, e.links.ep); });
  const double rc = per_layer([&](const Layout& x) { return lc.recompute(x.recompute); });
  // The last stage carries the head; the first the embedding (folded into the head term).
  // The pipeline runs at the pace of its slowest stage: the last (its layers and the head)
  // or, under an uneven cut, a fuller one without the head.
  const double layer_mb = lc.forward() + lc.backward() + rc + tp + cp + ep;
  const bool head_paces =
      l.pp == 1 || e.stage_layers.last * layer_mb + hc.forward + hc.backward >= Ls * layer_mb;
  const double Lp = head_paces ? e.stage_layers.last : Ls;  // layers of the pacing stage
  const double head = head_paces ? 1 : 0;
  double fwd_mb = Lp * lc.forward() + head * hc.forward;
  double bwd_mb = Lp * lc.backward() + head * hc.backward;
  if (rt == Runtime::tessera) {  // tessera's head computes its gradients in its forward pass
    fwd_mb += head * hc.backward;
    bwd_mb -= head * hc.backward;
  }
  const double stage_mb = fwd_mb + bwd_mb + Lp * (rc + tp + cp + ep);
  TimeBreakdown& t = e.time;
  t.forward = M * fwd_mb;
  t.backward = M * bwd_mb;
  t.compute = t.forward + t.backward;
  t.recompute = M * Lp * rc;
  t.tp_comm = M * Lp * tp;
  t.cp_comm = M * Lp * cp;
  t.ep_comm = M * Lp * ep;
  // DualPipe's pairs overlap their all-to-alls: in tessera when its runtime interleaves them
  // (pp::paired_overlap_off, the trainer's own rule); in a GPU framework that runs dualpipev
  // (DeepSeek's DualPipe, torchtitan) whenever the deck asks for it (parallel.pp_pair_overlap,
  // default true), in every composition, as the schedule is built for.
  const bool pairs_overlap =
      moe && l.ep > 1 && l.schedule == PipeSchedule::dualpipe_v &&
      (rt == Runtime::megatron ? w.pp_pair_overlap : tessera_pairs_interleave(w, l));
  if (pairs_overlap) t.ep_hidden = paired_ep_hidden(l, m, Lp, ep, lc, e.ep_pairs);
  if (moe && l.ep > 1) {
    // What a rank's all-to-alls send per step, its own rows included (as comm/ counts them):
    // four per MoE block and micro-batch (dispatch and combine, forward and backward:
    // model/moe.cpp; six with full recompute), each of the rank's kept rows. With balanced
    // loads each expert gets s top_k / E rows of a sequence, at most its capacity
    // ceil(capacity_factor s top_k / E) (model.capacity_factor > 0), so B E min(...) rows
    // (B s top_k when dropless); tessera's count exchange adds E floats.
    // Per stage: its MoE blocks (a deck's moe_layers; every block of a --experts workload).
    std::vector<double> blocks(size_t(l.pp), Ls);
    if (c.moe.enabled()) {
      const std::vector<int64_t> sizes = pp::split_layers(c, l.pp * l.vpp, w.pp_layers);
      const pp::ScheduleShape shape{l.pp, 1, l.vpp, l.run_schedule()};
      for (int stage = 0; stage < l.pp; ++stage) {
        blocks[size_t(stage)] = 0;
        for (const ChunkLayers& ch : pp::stage_layers(sizes, shape, stage))
          for (int64_t b = ch.first; b < ch.last; ++b) blocks[size_t(stage)] += c.moe.is_moe(b);
      }
    }
    const double calls = 4 + (l.recompute == Recompute::full ? 2 : 0);
    const double row = C * (rt == Runtime::tessera ? 4 : a);  // tessera sends fp32 rows
    const double s = double(c.seq_len) / l.cp, E = w.moe.experts, k = w.moe.top_k;
    double per_expert = s * k / E;  // of one sequence
    if (c.moe.enabled() && c.moe.capacity_factor > 0)
      per_expert = std::min(per_expert, std::ceil(double(c.moe.capacity_factor) * s * k / E));
    // A tp rank dispatches its share of the rows (model/moe.cpp, Moe::routed_rows).
    const double rows = double(l.micro_batch) * E * per_expert / l.tp;
    const double counts = rt == Runtime::tessera ? 4 * E : 0;
    // The two-level dispatch (doc/moe.md): inside the node the relays move the flat
    // dispatch's rows over fewer ranks; across nodes each token goes once to every other node
    // holding one of its experts, with its 2 k routing slots, and comes back summed, forward
    // and backward (the weights' k gradients with it). With uniform routing a token's k
    // experts (of E, E / n per node) touch n (1 - q) of the n nodes, q = C(E - E/n, k) /
    // C(E, k), at most ep_max_nodes; (n - 1) / n of them are not its own.
    double cross = 0;  // bytes a rank sends across nodes per MoE block and micro-batch
    const double n = double(w.ep_nodes);
    if (rt == Runtime::tessera && w.ep_dispatch == EpDispatch::two_level && n > 1) {
      double q = 1;
      for (int i = 0; i < int(k); ++i) q *= (E - E / n - i) / (E - i);
      double nodes = n * (1 - q);
      if (w.ep_max_nodes > 0) nodes = std::min(nodes, double(w.ep_max_nodes));
      const double tokens = double(l.micro_batch) * s / l.tp;
      cross = tokens * nodes * (n - 1) / n * ((calls * C + 3 * k) * 4) + calls * 4 * n;
    }
    for (const double b : blocks) {
      e.ep_bytes_by_stage.push_back(b * M * (calls * rows * row + counts));
      if (cross > 0) {
        e.ep_intra_bytes_by_stage.push_back(e.ep_bytes_by_stage.back());
        e.ep_cross_bytes_by_stage.push_back(b * M * cross);
        e.ep_bytes_by_stage.back() += e.ep_cross_bytes_by_stage.back();
      }
      e.ep_bytes_per_step = std::max(e.ep_bytes_per_step, e.ep_bytes_by_stage.back());
    }
  }
  t.pp_p2p = M * pp_seconds_per_microbatch(w, l, e.links.pp);
  if (pp::splits_backward(l.schedule) && l.pp > 1) {
    // The schedule's formula with a chunk's forward, input and weight passes equal (a
    // backward twice a forward, its GEMMs split evenly between B and W; doc/pipeline.md).
    const pp::Ratio f = pp::bubble_formula({l.pp, int(M), l.vpp, l.schedule});
    e.bubble_fraction = double(f.num) / double(f.den);
    t.pp_bubble = e.bubble_fraction * M * stage_mb;
  } else {
    t.pp_bubble = (p - 1) / l.vpp * stage_mb;
    e.bubble_fraction = (p - 1) / (l.vpp * M);
  }
  // DP/ZeRO traffic overlaps layer by layer (perf/overlap.hpp).
  LayerWindow win;
  win.fwd = lc.forward();
  win.bwd = lc.backward() + rc;
  const double tp_f = tp_seconds_per_layer(w, plain, e.links.tp) / 2;  // 2 of the 4 per layer
  win.tp_fwd = tp_f;
  win.tp_bwd = tp - tp_f;
  const double stage_layers_here = reported_layers;
  // tessera keeps fp32 gradients and master weights in every precision: its reductions move
  // 4 bytes an element unless grad=bf16 (parallel.grad_reduce_dtype), its gathers 4 bytes except
  // ZeRO-3's in bf16 / fp16, which gather the 16-bit copy of the shard.
  Layout moved = l;
  if (rt == Runtime::tessera) {
    moved.grad_bytes = l.grad_bytes ? l.grad_bytes : 4;
    moved.weight_bytes = l.zero == 3 && tessera_half(l) ? 2 : 4;
  }
  e.dp_overlap = dp_overlap(moved, e.links, e.params_per_rank, stage_layers_here, m, win);
  t.dp_comm = e.dp_overlap.total();
  t.dp_hidden = e.dp_overlap.hidden();
  const double updated = e.params_per_rank / (l.zero >= 1 ? N : 1);
  t.optimizer = 28 * updated / cl.memory_bw;
  e.step_seconds = t.total();

  // ---- throughput ----
  const double tokens = double(w.global_batch) * double(c.seq_len);
  const double n_acc = l.accelerators();
  e.tokens_per_second = tokens / e.step_seconds;
  e.model_flops_per_step = workload_flops_per_token(w) * tokens;
  const double microbatch_layers = L * double(w.global_batch) / l.micro_batch;
  e.hardware_flops_per_step = e.model_flops_per_step + per_layer([&](const Layout& x) {
                                                         return lc.recompute_flops(x.recompute);
                                                       }) * l.tp *
                                                           l.cp * microbatch_layers;
  const double peak = cl.peak(l.precision);
  e.model_tflops = e.model_flops_per_step / e.step_seconds / n_acc / 1e12;
  e.hardware_tflops = e.hardware_flops_per_step / e.step_seconds / n_acc / 1e12;
  e.mfu = e.model_flops_per_step / (e.step_seconds * n_acc * peak);
  e.hfu = e.hardware_flops_per_step / (e.step_seconds * n_acc * peak);
  e.mfu_causal = workload_flops_per_token(w, AttentionFlops::causal) * tokens /
                 (e.step_seconds * n_acc * peak);

  // ---- warnings ----
  if (l.tp > 1 && e.links.tp.crosses_nodes())
    e.warnings.push_back(cat("TP group of ", l.tp, " spans nodes (", cl.per_node,
                             " accelerators per node; worst group: ", describe(e.links.tp.place),
                             "): its 4-6 all-reduces per layer cross the ", e.links.tp.name,
                             " link at ", e.links.tp.bw / 1e9, " GB/s"));
  if (l.ep > 1 && e.links.ep.crosses_nodes())
    e.warnings.push_back(cat("EP group of ", l.ep, " spans nodes: all-to-alls cross the ",
                             e.links.ep.name, " link"));
  if (l.pp > 1 && m < l.pp)
    e.warnings.push_back(cat("fewer micro-batches (", m, ") than pipeline stages (", l.pp,
                             "): stages idle most of the step"));
  if (e.mfu > kMfuSanityBound)
    e.warnings.push_back(cat("predicted MFU ", 100 * e.mfu, "% is above ", 100 * kMfuSanityBound,
                             "%, more than any published dense run reaches on A100/H100: read "
                             "it as an error of the model, not a promise"));
  if (!e.fits())
    e.warnings.push_back(
        cat("out of memory: needs ", e.memory.total() / 1e9, " GB of ", e.capacity / 1e9, " GB"));
  return e;
}

}  // namespace tessera
