#include "perf/cost_model.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "perf/activation_memory.hpp"
#include "perf/compute_model.hpp"
#include "perf/memory.hpp"
#include "perf/tessera_memory.hpp"
#include "parallel/pp/schedule.hpp"
#include "parallel/pp/stage_layers.hpp"

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

}  // namespace

StageParams stage_params(const Workload& w, const Layout& l) {
  const ModelConfig& c = w.cfg;
  const double C = double(c.d_model), L = double(c.layers) / l.pp;
  const double layers = L * layer_params_per_rank(w, l);
  const double embed =
      double(c.vocab_padded) * C / l.tp + (c.arch == Arch::gpt2 ? double(c.seq_len) * C : 0);
  const double final_norm = C * (c.has_bias() ? 2 : 1);
  // The output head: its own matrix, or with tied embeddings a copy of the embedding on the
  // last stage when that is not the first (Megatron keeps both and all-reduces their grads).
  const double head = c.tie_embeddings && l.pp == 1 ? 0 : double(c.vocab_padded) * C / l.tp;
  StageParams s;
  if (w.moe.any()) {
    const double Fe = double(w.moe.expert_ffn ? w.moe.expert_ffn : c.ffn_hidden) / l.tp;
    s.experts = L * double(w.moe.experts) / l.ep * (c.arch == Arch::llama ? 3 : 2) * C * Fe;
  }
  s.first = layers + embed + (l.pp == 1 ? final_norm + head : 0);
  s.last = l.pp == 1 ? s.first : layers + final_norm + head;
  return s;
}

std::string layout_problem(const Workload& w, const Layout& l, const Cluster& cl, Runtime rt,
                           int accelerators) {
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
  // tessera balances layers that do not split evenly (pp/stage_layers.hpp); the searched
  // runtimes cut them evenly.

  if (rt != Runtime::tessera && c.layers % (int64_t(l.pp) * l.vpp) != 0)
    return cat("pp x v = ", l.pp * l.vpp, " does not divide the ", c.layers, " layers");
  if (l.vpp > 1 && l.pp == 1) return "v > 1 (interleaving) needs pp > 1";
  if (l.vpp > 1 && l.schedule == PipeSchedule::gpipe) return "v > 1 needs the 1F1B schedule";
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
  if (l.zero >= 2 && l.pp > 1 && rt != Runtime::tessera)
    return cat("zero = ", l.zero, " with pp = ", l.pp,
               ": ZeRO-2/3 shard the gradients that a "
               "pipeline accumulates over its micro-batches (Megatron-LM and DeepSpeed allow "
               "only ZeRO-1 with pipeline parallelism; tessera runs them, at the cost of "
               "reduce-scattering every micro-batch)");
  const int64_t m = microbatches(w, l);
  if (m == 0)
    return cat("the global batch ", w.global_batch,
               " is not a multiple of dp x mb = ", l.dp * l.micro_batch);
  if (l.vpp > 1 && m % l.pp != 0)
    return cat("interleaving needs micro-batches (", m, ") to be a multiple of pp = ", l.pp);
  if (rt == Runtime::tessera && l.pp > 1) {  // tessera's own rules for its pipelines
    try {
      pp::require_valid(tessera_schedule_shape(l, m));
      (void)pp::split_layers(c, l.pp * l.vpp, w.pp_layers);
    } catch (const Error& e) {
      return e.what();
    }
  }
  if (rt == Runtime::tessera) {
    if (l.cp > 1 || l.ep > 1)
      return "tessera runs data, tensor, sequence and pipeline parallelism and ZeRO today (CP "
             "and EP are not implemented yet)";
    if (c.kv_heads % l.tp != 0)
      return cat("tessera needs tp (", l.tp, ") to divide the ", c.kv_heads, " key/value heads");
    if (c.vocab_padded % l.tp != 0)
      return cat("tessera needs tp (", l.tp, ") to divide the padded vocabulary ", c.vocab_padded);
    if (l.seq_parallel && (int64_t(l.micro_batch) * c.seq_len) % l.tp != 0)
      return cat("sequence parallelism needs tp (", l.tp, ") to divide the ",
                 int64_t(l.micro_batch) * c.seq_len, " tokens of a micro-batch");
    if (l.precision != ComputeType::fp32) return "tessera trains in fp32 only today";
  }
  (void)cl.peak(l.precision);  // throws when the accelerator lacks this precision
  return {};
}

TesseraParts tessera_parts(const ModelConfig& c, int zero, int shard_ranks) {
  auto r16 = [](double n) { return std::ceil(n / 16) * 16; };
  const double t = double(c.tp.size);
  const double C = double(c.d_model), F = double(c.ffn_hidden) / t;
  const double Vl = double(c.vocab_padded) / t;
  const double qd = double(c.heads * c.head_dim) / t, kvd = double(c.kv_heads * c.head_dim) / t;
  const bool b = c.has_bias();
  TesseraParts p;
  p.embed = r16(Vl * C) + (c.arch == Arch::gpt2 ? r16(double(c.seq_len) * C) : 0);
  p.block = 2 * r16(C) + (b ? 2 * r16(C) : 0);              // norms
  p.block += r16(qd * C) + 2 * r16(kvd * C) + r16(C * qd);  // q, k, v (columns), o (rows)
  if (b) p.block += r16(qd) + 2 * r16(kvd) + r16(C);
  p.block += (c.arch == Arch::llama ? 3 : 2) * r16(C * F);  // (gate,) up, down
  if (b) p.block += r16(F) + r16(C);
  p.head = r16(C) + (b ? r16(C) : 0) + (c.tie_embeddings ? 0 : r16(Vl * C));
  if (zero == 0) {  // one part, 16-aligned
    p.total = p.embed + double(c.layers) * p.block + p.head;
    return p;
  }
  const double align = 16.0 * shard_ranks;
  auto ra = [&](double n) { return std::ceil(n / align) * align; };
  p.embed = ra(p.embed), p.block = ra(p.block), p.head = ra(p.head);
  p.total = p.embed + double(c.layers) * p.block + p.head;
  return p;
}

double tessera_padded_params(const ModelConfig& c, int zero, int shard_ranks) {
  return tessera_parts(c, zero, shard_ranks).total;
}

Estimate estimate(const Workload& w, const Layout& l, const Cluster& cl, Runtime rt) {
  const ModelConfig& c = w.cfg;
  Estimate e;
  e.layout = l;
  e.runtime = rt;
  e.microbatches = microbatches(w, l);
  e.capacity = cl.memory;
  e.links = group_links(l, cl);
  const int64_t m = e.microbatches;
  const double M = double(m), p = l.pp, L = double(c.layers), Ls = L / p;
  const int N = l.shard_ranks();
  const bool moe = w.moe.any();
  const Precision prec = l.mixed() ? Precision::mixed : Precision::fp32;

  // ---- memory ----
  const StageParams sp = stage_params(w, l);
  const double a = activation_element_bytes(l);
  const double T = double(l.micro_batch) * double(c.seq_len) / l.cp;
  const double C = double(c.d_model);
  const LayerActivations act = layer_activations(w, l, moe);
  const double saved = saved_bytes_per_layer(act, l.recompute);
  if (rt == Runtime::tessera && l.pp > 1) {
    ModelConfig tc = c;
    tc.tp = {l.tp, 0, l.seq_parallel};
    tc.recompute = l.recompute;  // the layout's mode; recompute_layers from the deck
    const TesseraStageMemory sm = tessera_pipeline_memory(tc, l, m, w.zero_inflight, w.pp_layers);
    e.memory = sm.memory;
    e.params_per_rank = sm.params;
  } else if (rt == Runtime::tessera) {
    ModelConfig tc = c;
    tc.tp = {l.tp, 0, l.seq_parallel};
    tc.recompute = l.recompute;  // the layout's mode; recompute_layers from the deck
    const double psi = tessera_padded_params(tc, l.zero, N);
    const ModelStateBytes s = zero_model_state(l.zero, psi, N, Precision::fp32);
    e.params_per_rank = psi;
    e.memory.params = s.params;
    e.memory.grads = s.grads;
    e.memory.optimizer = s.optimizer;
    e.memory.activations = activation_bytes(tc, l.micro_batch);
    e.memory.workspace = tessera_workspace_bytes(tc, l.micro_batch);
    e.memory.comm = tessera_comm_bytes(tc, l.zero, N, m, w.zero_inflight);
  } else {
    auto stage_memory = [&](bool first, bool last, double psi) {
      MemoryBreakdown mb;
      // Expert weights are replicated over dp x cp / ep ranks only, so ZeRO shards them over
      // that many (Megatron-LM's expert-data-parallel group).
      const ModelStateBytes s = zero_model_state(l.zero, psi - sp.experts, N, prec);
      const ModelStateBytes x = zero_model_state(l.zero, sp.experts, std::max(1, N / l.ep), prec);
      mb.params = s.params + x.params, mb.grads = s.grads + x.grads;
      mb.optimizer = s.optimizer + x.optimizer;
      // Micro-batches in flight on this stage: first stage p (1F1B), last stage 1.
      const double layer_eq = first ? inflight_layer_equivalents(l, c.layers, m)
                                    : (l.schedule == PipeSchedule::gpipe ? Ls * M : Ls);
      const double in_flight = l.pp == 1 ? 1 : layer_eq / Ls;
      mb.activations = layer_eq * saved;
      if (l.recompute == Recompute::full) mb.activations += act.total();  // one layer rebuilt
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
    const MemoryBreakdown f = stage_memory(true, l.pp == 1, sp.first);
    const MemoryBreakdown g = stage_memory(l.pp == 1, true, sp.last);
    const bool use_first = f.total() >= g.total();
    e.memory = use_first ? f : g;
    e.params_per_rank = use_first ? sp.first : sp.last;
  }

  // ---- time ----
  const LayerCompute lc = layer_compute(w, l, cl, moe);
  const HeadCompute hc = head_compute(w, l, cl);
  const double tp = tp_seconds_per_layer(w, l, e.links.tp);
  const double cp_raw = cp_seconds_per_layer(w, l, e.links.cp);
  const double attn =
      lc.attn_fwd + lc.attn_bwd + (l.recompute != Recompute::none ? lc.attn_fwd : 0);
  const double cp = std::max(0.0, cp_raw - attn);
  const double ep = ep_seconds_per_layer(w, l, e.links.ep);
  const double rc = lc.recompute(l.recompute);
  // The last stage carries the head; the first the embedding (folded into the head term).
  double fwd_mb = Ls * lc.forward() + hc.forward;
  double bwd_mb = Ls * lc.backward() + hc.backward;
  if (rt == Runtime::tessera) {  // tessera's head computes its gradients in its forward pass
    fwd_mb += hc.backward;
    bwd_mb -= hc.backward;
  }
  const double stage_mb = fwd_mb + bwd_mb + Ls * (rc + tp + cp + ep);
  TimeBreakdown& t = e.time;
  t.forward = M * fwd_mb;
  t.backward = M * bwd_mb;
  t.compute = t.forward + t.backward;
  t.recompute = M * Ls * rc;
  t.tp_comm = M * Ls * tp;
  t.cp_comm = M * Ls * cp;
  t.ep_comm = M * Ls * ep;
  t.pp_p2p = M * pp_seconds_per_microbatch(w, l, e.links.pp);
  t.pp_bubble = (p - 1) / l.vpp * stage_mb;
  e.bubble_fraction = (p - 1) / (l.vpp * M);
  const DpComm dc = dp_comm(l, e.links, e.params_per_rank, m);
  t.dp_comm = dc.total();
  double window = bwd_mb;                // zero 0-1: the last micro-batch's backward
  if (l.zero == 2) window = M * bwd_mb;  // every backward
  if (l.zero == 3) window = M * (fwd_mb + bwd_mb);
  t.dp_hidden = std::min(dc.overlappable, window);
  const double updated = e.params_per_rank / (l.zero >= 1 ? N : 1);
  t.optimizer = 28 * updated / cl.memory_bw;
  e.step_seconds = t.total();

  // ---- throughput ----
  const double tokens = double(w.global_batch) * double(c.seq_len);
  const double n_acc = l.accelerators();
  e.tokens_per_second = tokens / e.step_seconds;
  e.model_flops_per_step = workload_flops_per_token(w) * tokens;
  const double microbatch_layers = L * double(w.global_batch) / l.micro_batch;
  e.hardware_flops_per_step =
      e.model_flops_per_step + lc.recompute_flops(l.recompute) * l.tp * l.cp * microbatch_layers;
  const double peak = cl.peak(l.precision);
  e.model_tflops = e.model_flops_per_step / e.step_seconds / n_acc / 1e12;
  e.hardware_tflops = e.hardware_flops_per_step / e.step_seconds / n_acc / 1e12;
  e.mfu = e.model_flops_per_step / (e.step_seconds * n_acc * peak);
  e.hfu = e.hardware_flops_per_step / (e.step_seconds * n_acc * peak);

  // ---- warnings ----
  if (l.tp > 1 && e.links.tp.bw < cl.intra.bw)
    e.warnings.push_back(cat("TP group of ", l.tp, " spans nodes (", cl.per_node,
                             " accelerators per node): its 4-6 all-reduces per layer cross the ",
                             e.links.tp.name, " link at ", e.links.tp.bw / 1e9, " GB/s"));
  if (l.ep > 1 && e.links.ep.bw < cl.intra.bw)
    e.warnings.push_back(cat("EP group of ", l.ep, " spans nodes: all-to-alls cross the ",
                             e.links.ep.name, " link"));
  if (l.pp > 1 && m < l.pp)
    e.warnings.push_back(cat("fewer micro-batches (", m, ") than pipeline stages (", l.pp,
                             "): stages idle most of the step"));
  if (!e.fits())
    e.warnings.push_back(
        cat("out of memory: needs ", e.memory.total() / 1e9, " GB of ", e.capacity / 1e9, " GB"));
  return e;
}

}  // namespace tessera
