#include "perf/tessera_memory.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "parallel/dp/zero_schedule.hpp"
#include "parallel/pp/paired_overlap.hpp"
#include "parallel/pp/schedule.hpp"
#include "parallel/pp/stage_layers.hpp"
#include "perf/activation_memory.hpp"
#include "perf/memory.hpp"

namespace tessera {
namespace {

// tessera's BufferPool as bytes: a take reuses a free buffer of exactly that size, or
// allocates one; allocated() is what the pool holds at the end (it never frees).
struct PoolReplay {
  std::map<double, int> free, total;
  void take(double n) {
    if (n <= 0) return;
    if (free[n] > 0)
      --free[n];
    else
      ++total[n];
  }
  void give(double n) {
    if (n > 0) ++free[n];
  }
  double allocated() const {
    double bytes = 0;
    for (const auto& [n, count] : total) bytes += n * count;
    return 4 * bytes;
  }
};

// The parts a rank holds, by part index (0 embedding, 1..L blocks, L+1 head; 0 elements
// where another pipeline stage holds it), and the order their passes run in one step.
struct ZeroSteps {
  std::vector<double> size;
  std::vector<double> piece;  // a rank's shard of each part (size / K when empty)
  bool tied = false;          // the head reads the token table (part 0)
  bool defer0 = false;        // part 0's gradients stay whole until the step's end (Zero::defer)
  bool split = false;         // backward passes are followed by weight passes (PartAccess::split)
  std::vector<std::pair<int, Pass>> passes;  // (part, pass) in order
};

// How one rank's ZeRO moves its buffers: the stage, shard ranks K, replica groups (HSDP),
// reductions in flight, whether stage 3 gathers a 16-bit compute copy (train.precision bf16 /
// fp16) and whether gradients travel in bf16 (parallel.grad_reduce_dtype).
struct ZeroReplay {
  int zero = 0;
  double K = 1;
  int replicas = 1, inflight = 2;
  bool half = false, reduce16 = false;
};

// Replays one training step of ZeRO's schedule (the ZeroSchedule the runtime executes) with
// sizes: what each action takes from and gives back to the buffer pool, as Zero::run does.
// 4-byte and 2-byte buffers are pooled apart (a take reuses only a buffer of its dtype).
double replay_zero(const ZeroSteps& z, const ZeroReplay& r) {
  if (r.zero < 2 && !r.reduce16) return 0;  // stages 0-1 reduce from the full gradient buffer
  const int head = int(z.size.size()) - 1;
  std::vector<int64_t> sizes;
  for (double n : z.size) sizes.push_back(int64_t(std::llround(n)));
  ZeroSchedule schedule(r.zero, PartAccess{head, z.tied, z.split}, sizes, r.inflight);
  if (z.defer0) schedule.defer(0);
  PoolReplay pool, copies;  // 4-byte, 2-byte
  const bool gather16 = r.half && r.zero == 3;
  std::vector<char> waited(z.size.size(), 0);
  auto play = [&](const std::vector<ZeroAction>& actions) {
    for (const ZeroAction& a : actions) {
      const double n = z.size[size_t(a.part)];
      const double piece = z.piece.empty() ? n / r.K : z.piece[size_t(a.part)];
      switch (a.kind) {
        case ZeroAction::build:
          pool.take(n), pool.give(n);
          break;
        case ZeroAction::fetch:
          (gather16 ? copies : pool).take(n);
          break;
        case ZeroAction::wait:
          if (gather16 && !waited[size_t(a.part)]) pool.take(n), waited[size_t(a.part)] = 1;
          break;
        case ZeroAction::release:
          if (!gather16)
            pool.give(n);
          else
            copies.give(n), pool.give(waited[size_t(a.part)] ? n : 0);
          waited[size_t(a.part)] = 0;
          break;
        case ZeroAction::stage:
          pool.take(n);
          break;
        case ZeroAction::reduce:
          if (!r.reduce16) {
            pool.take(piece);
          } else {
            copies.take(n);
            if (r.zero >= 2) pool.give(n);  // the fp32 staging, rounded into the 16-bit one
            copies.take(piece);
          }
          break;
        case ZeroAction::retire:
          if (!r.reduce16) {
            pool.give(n), pool.give(piece);
          } else {
            pool.take(piece), pool.give(piece);  // the reduced piece widened
            copies.give(n), copies.give(piece);
          }
          break;
      }
    }
  };
  play(schedule.initialize());
  schedule.begin_step();
  for (const auto& [part, pass] : z.passes) {
    play(schedule.begin(part, pass, true));
    play(schedule.end(part, pass, true, false));
  }
  play(schedule.finish());
  if (r.reduce16 && r.replicas > 1) {  // HSDP: the gradient shard rounded for the all-reduce
    double local = 0;
    for (size_t q = 0; q < z.size.size(); ++q)
      local += z.piece.empty() ? z.size[q] / r.K : z.piece[q];
    copies.take(local), copies.give(local);
  }
  return pool.allocated() + copies.allocated() / 2;
}

// The weight-gradient GEMMs a split backward's B queues for a chunk of blocks [first, last),
// in queue order (model/block.cpp: each block's MLP or mixture of experts, then its
// attention; the blocks in reverse): the elements of each one's dy and x operands, copies of
// their own (`gemms`), and a mixture of experts' regions (`regions`: the routed experts'
// operands, model/weight_grads.hpp). Rows are a micro-batch's tokens on this rank (gathered
// under sequence parallelism); the sizes are this tp rank's.
struct WeightOperands {
  std::vector<std::pair<double, double>> gemms;
  std::vector<double> regions;
};
WeightOperands weight_gemm_operands(const ModelConfig& c, int64_t micro_batch, int64_t first,
                                    int64_t last) {
  const double N = double(micro_batch * c.seq_local()), C = double(c.d_model);
  const double F = double(c.ffn_local()), q = double(c.heads_local() * c.head_dim),
               kv = double(c.kv_heads_local() * c.head_dim);
  const bool gated = c.arch == Arch::llama;
  WeightOperands out;
  for (int64_t b = last - 1; b >= first; --b) {
    if (!c.moe.is_moe(b)) {
      out.gemms.push_back({N * C, N * F});             // down
      if (gated) out.gemms.push_back({N * F, N * C});  // gate
      out.gemms.push_back({N * F, N * C});             // up
    } else {
      // model/moe.cpp's backward: the shared experts (an Mlp of shared x F_e / t), the routed
      // experts into regions of the expert side's Rx rows (down's dy and x, gate's and up's
      // dy, their input), then the router (its N / t rows, Moe::routed_rows).
      const double t = double(c.tp.size), Fe = double(c.moe.ffn), E = double(c.moe.experts);
      const double Fs = double(c.moe.shared) * Fe / t;
      const double Rx = double(c.experts_held.size) * N * double(c.moe.top_k);
      if (c.moe.shared > 0) {
        out.gemms.push_back({N * C, N * Fs});
        if (gated) out.gemms.push_back({N * Fs, N * C});
        out.gemms.push_back({N * Fs, N * C});
      }
      out.regions.push_back(Rx * C), out.regions.push_back(Rx * Fe);
      if (gated) out.regions.push_back(Rx * Fe);
      out.regions.push_back(Rx * Fe), out.regions.push_back(Rx * C);
      const double Q = std::ceil(N / t);
      out.gemms.push_back({Q * E, Q * C});  // router
    }
    out.gemms.push_back({N * C, N * q});   // o
    out.gemms.push_back({N * q, N * C});   // q
    out.gemms.push_back({N * kv, N * C});  // k
    out.gemms.push_back({N * kv, N * C});  // v
  }
  return out;
}

ZeroReplay zero_replay(const Layout& l, int inflight) {
  ZeroReplay r;
  r.zero = l.zero;
  r.K = l.shard_ranks();
  r.replicas = int(l.dp * l.cp / l.shard_ranks());
  r.inflight = inflight;
  r.half = tessera_half(l);
  r.reduce16 = l.zero >= 1 && l.grad_bytes == 2 && l.dp * l.cp > 1;
  return r;
}

// The workload's model as a planned layout runs it: whole (RankLayout splits it), with the
// layout's recompute mode (recompute_layers from the deck) and precision.
ModelConfig tessera_whole_model(const Workload& w, const Layout& l) {
  ModelConfig whole = w.cfg;
  whole.tp = TensorParallel{};
  whole.cp = ContextParallel{};
  whole.experts_held = ExpertShard{};
  whole.recompute = l.recompute;
  whole.compute = precision_names(l.precision).compute;
  return whole;
}

// The layout's keys as a deck would give them to tessera.
ParallelSection tessera_parallel_section(const Workload& w, const Layout& l) {
  ParallelSection p;
  p.tp = l.tp, p.sequence_parallel = l.seq_parallel;
  p.cp = l.cp, p.cp_kind = w.cp_kind;
  p.pp = l.pp, p.pp_virtual = l.vpp, p.pp_layers = w.pp_layers;
  p.pp_schedule = l.run_schedule();
  p.dp = l.dp, p.ep = l.ep, p.order = l.order;
  p.ep_dispatch = w.ep_dispatch, p.ep_nodes = w.ep_nodes, p.ep_max_nodes = w.ep_max_nodes;
  p.zero = l.zero, p.zero_inflight = w.zero_inflight, p.shard_group = l.shard_group;
  p.pp_pair_overlap = w.pp_pair_overlap;
  return p;
}

}  // namespace

bool tessera_pairs_interleave(const Workload& w, const Layout& l) {
  if (l.schedule != PipeSchedule::dualpipe_v) return false;  // (no pairs: no rank layout needed)
  // The rank's model: RankLayout decides the dispatch (moe.two_level).
  return pp::paired_overlap_off(tessera_parallel_section(w, l), tessera_rank_layout(w, l, 0).model,
                                w.device)
      .empty();
}

RankLayout tessera_rank_layout(const Workload& w, const Layout& l, int stage) {
  const ModelConfig whole = tessera_whole_model(w, l);
  const ParallelSection p = tessera_parallel_section(w, l);
  const GridLayout grid({l.tp, l.cp, l.ep, l.dp, l.pp}, l.order, l.accelerators());
  GridLayout::Coord at;
  at.pp = stage;
  return RankLayout::make(whole, p, l.micro_batch, w.global_batch, grid, grid.rank(at), 1);
}

Layout tessera_layout(const RankLayout& r) {
  const ModelConfig& c = r.model;
  Layout l;
  l.tp = r.degrees.tp, l.cp = r.degrees.cp, l.ep = r.degrees.ep;
  l.dp = r.degrees.dp, l.pp = r.degrees.pp;
  l.vpp = r.schedule.chunks;
  // A Layout spells interleaved 1F1B as one_f_one_b with vpp > 1.
  l.schedule =
      r.schedule.kind == PipeSchedule::interleaved ? PipeSchedule::one_f_one_b : r.schedule.kind;
  l.seq_parallel = c.tp.sequence_parallel && l.tp > 1;
  l.zero = r.zero;
  l.shard_group = r.zero > 0 && r.shard_ranks != r.dp_cp ? int(r.shard_ranks) : 0;
  l.micro_batch = int(r.batch.micro_batch);
  l.recompute = c.recompute;
  l.precision = precision_names(c.compute).planner;
  return l;
}

double moe_two_level_comm_bytes(const ModelConfig& c, int64_t micro_batch) {
  if (!c.moe.enabled() || !c.moe.two_level) return 0;
  const double N = double(micro_batch * c.seq_local()), D = double(c.moe.nodes);
  const double K = double(c.moe.top_k), C = double(c.d_model);
  return 4 * (2 * N * D * C + N * D * K * C + 2 * N * D * K);
}

bool tessera_half(const Layout& l) {
  return l.precision == ComputeType::bf16 || l.precision == ComputeType::fp16;
}

double tessera_grad_staging_bytes(const Layout& l, double psi) {
  return l.grad_bytes == 2 && l.zero == 0 && l.dp * l.cp > 1 ? 2 * psi : 0;
}

double tessera_document_bytes(const Workload& w, const ModelConfig& c, int64_t micro_batch,
                              int64_t slots) {
  if (!w.document_mask) return 0;
  const double B = double(micro_batch), T = double(c.seq_len), Tl = double(c.seq_local());
  return 4 * B * (T + 1) + 4 * double(slots) * B * (2 * Tl + T);
}

double tessera_comm_bytes(const RankLayout& rank, const Layout& l, int64_t accum, int inflight) {
  const ZeroReplay r = zero_replay(l, inflight);
  if (r.zero < 2 && !r.reduce16) return 0;
  const ModelConfig& c = rank.model;
  const int head = int(c.layers) + 1;
  ZeroSteps z;
  for (int q = 0; q <= head; ++q) {
    z.size.push_back(rank.part_elements[size_t(q)]);
    z.piece.push_back(rank.sections.piece(c, q, r.K));
  }
  z.tied = c.tie_embeddings;
  for (int64_t m = 0; m < accum; ++m) {
    for (int q = 0; q <= head; ++q) z.passes.push_back({q, Pass::forward});
    for (int q = head; q >= 0; --q) z.passes.push_back({q, Pass::backward});
  }
  return replay_zero(z, r);
}

TesseraStageMemory tessera_pipeline_memory(const Workload& w, const Layout& l, int64_t m) {
  const RankLayout first = tessera_rank_layout(w, l, 0);
  const ModelConfig& c = first.model;
  const pp::ScheduleShape& shape = first.schedule;
  const pp::Schedule schedule = pp::make_schedule(shape);
  const int head = int(c.layers) + 1;
  const double rows = double(l.micro_batch * c.seq_local()) /
                      (c.tp.sequence_parallel && c.tp.size > 1 ? c.tp.size : 1);
  const double message = rows * double(c.d_model);  // floats per activation message
  const double embed_act = 4 * rows * double(c.d_model);
  const double head_act = 4 * (rows * (c.arch == Arch::gpt2 ? 2 : 1) + rows * double(c.d_model));
  const bool interleave = tessera_pairs_interleave(w, l);
  TesseraStageMemory out;
  MemoryBreakdown& peak = out.memory;
  for (int s = 0; s < l.pp; ++s) {
    const RankLayout r = s == 0 ? first : tessera_rank_layout(w, l, s);
    const std::vector<pp::ChunkLayers>& chunks = r.chunks;
    ZeroSteps z;
    z.size = r.part_elements;
    // A rank's piece of each part it holds: size / K, but a mixture-of-experts block's experts
    // are sharded over their own shard ranks (ParamSections::piece).
    const double K = zero_replay(l, w.zero_inflight).K;
    for (int q = 0; q <= head; ++q)
      z.piece.push_back(q >= 1 && q <= int(c.layers) && c.moe.enabled() && z.size[size_t(q)] > 0
                            ? r.sections.piece(c, q, K)
                            : z.size[size_t(q)] / K);
    z.tied = c.tie_embeddings;
    z.defer0 = c.tie_embeddings;  // the tied table's gradients summed over the pipeline first
    const double psi = r.params;
    // Activation slots: a forward takes the lowest free slot, its backward (or B) frees it; a
    // layer's buffers exist for each slot it ever ran in (pp/executor.cpp). A split backward's
    // B takes the lowest free set of weight-gradient copies and its W frees it; a set's
    // buffers, by position, grow to the largest GEMM queued there (model/weight_grads.cpp).
    z.split = shape.split_backward();
    std::vector<std::set<int>> slots(chunks.size());
    std::vector<int> slot_of(size_t(m) * chunks.size(), -1), set_of(slot_of);
    std::vector<char> busy, set_busy;
    std::vector<std::vector<std::pair<double, double>>> set_capacity;  // (dy, x) elements
    std::vector<std::vector<double>> set_regions;                      // elements
    // DualPipe's interleaved pairs: their backward_input passes run on the second scratch.
    const std::vector<pp::Op>& ops = schedule.stages[size_t(s)];
    std::vector<char> on_pair_scratch(ops.size(), 0);
    if (interleave)
      for (const pp::OpPair& pair : pp::op_pairs(shape, ops)) on_pair_scratch[pair.backward] = 1;
    std::vector<int64_t> backward_blocks, pair_blocks;  // as the backward passes visit them
    for (size_t o = 0; o < ops.size(); ++o) {
      const pp::Op& op = ops[o];
      const size_t i = size_t(op.micro) * chunks.size() + size_t(op.chunk);
      const pp::ChunkLayers& k = chunks[size_t(op.chunk)];
      std::vector<int> order;
      if (k.embedding) order.push_back(0);
      for (int64_t b = k.first; b < k.last; ++b) order.push_back(int(b + 1));
      if (k.head) order.push_back(head);
      if (op.kind == pp::Op::forward) {
        auto f = std::find(busy.begin(), busy.end(), 0);
        const int slot = int(f - busy.begin());
        if (f == busy.end())
          busy.push_back(1);
        else
          *f = 1;
        slot_of[i] = slot;
        slots[size_t(op.chunk)].insert(slot);
        for (int q : order) z.passes.push_back({q, Pass::forward});
      } else if (op.computes_input_grad()) {
        for (auto q = order.rbegin(); q != order.rend(); ++q)
          z.passes.push_back({*q, Pass::backward});
        busy[size_t(slot_of[i])] = 0;
        for (int64_t b = k.last - 1; b >= k.first; --b)
          (on_pair_scratch[o] ? pair_blocks : backward_blocks).push_back(b);
      }
      if (op.kind == pp::Op::backward_input) {
        auto f = std::find(set_busy.begin(), set_busy.end(), 0);
        const int set = int(f - set_busy.begin());
        if (f == set_busy.end())
          set_busy.push_back(1), set_capacity.emplace_back(), set_regions.emplace_back();
        else
          *f = 1;
        set_of[i] = set;
        std::vector<std::pair<double, double>>& cap = set_capacity[size_t(set)];
        const WeightOperands w = weight_gemm_operands(c, l.micro_batch, k.first, k.last);
        const std::vector<std::pair<double, double>>& gemms = w.gemms;
        if (cap.size() < gemms.size()) cap.resize(gemms.size(), {0.0, 0.0});
        for (size_t g = 0; g < gemms.size(); ++g)
          cap[g] = {std::max(cap[g].first, gemms[g].first),
                    std::max(cap[g].second, gemms[g].second)};
        std::vector<double>& reg = set_regions[size_t(set)];
        if (reg.size() < w.regions.size()) reg.resize(w.regions.size(), 0.0);
        for (size_t g = 0; g < w.regions.size(); ++g) reg[g] = std::max(reg[g], w.regions[g]);
      } else if (op.kind == pp::Op::backward_weight) {
        for (auto q = order.rbegin(); q != order.rend(); ++q)
          z.passes.push_back({*q, Pass::weight});
        set_busy[size_t(set_of[i])] = 0;
      }
    }
    double weight_copies = 0;  // elements, in the compute dtype
    for (const auto& cap : set_capacity)
      for (const auto& [dy, x] : cap) weight_copies += dy + x;
    for (const auto& reg : set_regions)
      for (const double n : reg) weight_copies += n;
    MemoryBreakdown mb;
    const ModelStateBytes st = r.model_state();
    mb.params = st.params;
    mb.grads = st.grads, mb.optimizer = st.optimizer;
    double messages = 0;  // the executor's buffers per micro-batch: received and sent copies
    bool blocks = false;  // the shared set of rebuilt activations exists once per rank
    for (size_t k = 0; k < chunks.size(); ++k) {
      const pp::ChunkLayers& ch = chunks[k];
      blocks |= ch.last > ch.first;
      mb.activations += double(slots[k].size()) *
                        (chunk_kept_bytes(c, l.micro_batch, ch.last - ch.first, ch.first) +
                         (ch.embedding ? embed_act : 0) + (ch.head ? head_act : 0));
      // Received and sent copies per direction; at a V's turn the tensor is copied into the
      // other chunk's receive buffer, and nothing is sent.
      const int mc = shape.model_chunk(s, int(k)), C = shape.model_chunks();
      if (mc > 0) messages += 1.0 + shape.crosses(mc - 1);
      if (mc < C - 1) messages += 1.0 + shape.crosses(mc);
    }
    if (blocks) mb.activations += rebuilt_bytes(c, l.micro_batch);
    mb.activations += weight_copies * (tessera_half(l) ? 2 : 4);
    double moe_blocks = 0;  // held on this stage, each with its own relay buffers
    for (const pp::ChunkLayers& ch : chunks)
      for (int64_t b = ch.first; b < ch.last; ++b) moe_blocks += c.moe.is_moe(b) ? 1 : 0;
    mb.comm = 4 * message * double(m) * messages +
              moe_blocks * moe_two_level_comm_bytes(c, l.micro_batch) +
              replay_zero(z, zero_replay(l, w.zero_inflight)) + tessera_grad_staging_bytes(l, psi);
    // Scratch as the whole model's (the last stage runs blocks and the head), plus every
    // micro-batch's inputs and targets (int32) held for the step; with interleaved pairs, the
    // second scratch of their backward_input passes.
    const bool has_head = std::any_of(chunks.begin(), chunks.end(),
                                      [](const pp::ChunkLayers& ch) { return ch.head; });
    mb.workspace =
        tessera_workspace_bytes(c, l.micro_batch, tessera_half(l), backward_blocks, has_head) +
        tessera_pair_scratch_bytes(c, l.micro_batch, tessera_half(l), pair_blocks,
                                   backward_blocks) +
        4 * 2 * double(m) * double(l.micro_batch * c.seq_local()) +
        tessera_document_bytes(w, c, l.micro_batch, m);
    peak.params = std::max(peak.params, mb.params);
    peak.grads = std::max(peak.grads, mb.grads);
    peak.optimizer = std::max(peak.optimizer, mb.optimizer);
    peak.activations = std::max(peak.activations, mb.activations);
    peak.comm = std::max(peak.comm, mb.comm);
    peak.workspace = std::max(peak.workspace, mb.workspace);
    out.params = std::max(out.params, psi);
  }
  return out;
}

}  // namespace tessera
