#include "parallel/rank_layout.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "parallel/pp/stage_layers.hpp"

namespace tessera {

BatchGeometry BatchGeometry::from(int64_t micro_batch, int64_t global_batch, int64_t dp) {
  BatchGeometry g;
  g.dp = dp;
  g.micro_batch = micro_batch;
  g.global_batch = global_batch;
  if (g.global_batch == 0) g.global_batch = g.micro_batch * dp;
  TESSERA_REQUIRE(g.global_batch % (g.micro_batch * dp) == 0,
                  "train.global_batch = ", g.global_batch,
                  " is not a multiple of train.micro_batch x dp = ", g.micro_batch, " x ", dp,
                  " = ", g.micro_batch * dp);
  g.accum = g.global_batch / (g.micro_batch * dp);
  return g;
}

int64_t shard_ranks_of(int64_t shard_group, int64_t dp_cp) {
  return shard_group == 0 ? dp_cp : shard_group;
}

int64_t expert_shard_ranks_of(int64_t shard_ranks, int64_t ep) {
  return shard_ranks >= ep ? shard_ranks / ep : 1;
}

ModelStateBytes zero_model_state(int stage, double psi, double n, bool mixed) {
  ModelStateBytes b;
  if (!mixed) {
    b.params = stage >= 3 ? 4 * psi / n : 4 * psi;
    b.grads = stage == 0 ? 4 * psi : stage == 1 ? 4 * psi + 4 * psi / n : 4 * psi / n;
    b.optimizer = stage >= 1 ? 8 * psi / n : 8 * psi;
  } else {  // bf16/fp16 parameters and gradients, fp32 master weights and moments (12 bytes)
    b.params = stage >= 3 ? 2 * psi / n : 2 * psi;
    b.grads = stage >= 2 ? 2 * psi / n : 2 * psi;
    b.optimizer = stage >= 1 ? 12 * psi / n : 12 * psi;
  }
  return b;
}

ParamSections param_sections(const ModelConfig& c, int zero, int64_t shard_ranks) {
  auto r16 = [](double n) { return std::ceil(n / 16) * 16; };
  const double t = double(c.tp.size);
  const double C = double(c.d_model), F = double(c.ffn_hidden) / t;
  const double Vl = double(c.vocab_padded) / t;
  const double qd = double(c.heads * c.head_dim) / t, kvd = double(c.kv_heads * c.head_dim) / t;
  const bool b = c.has_bias();
  const double mats = c.arch == Arch::llama ? 3 : 2;
  ParamSections p;
  p.embed = r16(Vl * C) + (c.arch == Arch::gpt2 ? r16(double(c.seq_len) * C) : 0);
  double common = 2 * r16(C) + (b ? 2 * r16(C) : 0);       // norms
  common += r16(qd * C) + 2 * r16(kvd * C) + r16(C * qd);  // q, k, v (columns), o (rows)
  if (b) common += r16(qd) + 2 * r16(kvd) + r16(C);
  p.block = common + mats * r16(C * F) + (b ? r16(F) + r16(C) : 0);  // (gate,) up, down
  p.head = r16(C) + (b ? r16(C) : 0) + (c.tie_embeddings ? 0 : r16(Vl * C));
  const double moe_blocks = c.moe.enabled() ? double(c.moe_blocks()) : 0;
  const double ep = double(c.experts_held.size);
  if (moe_blocks > 0) {  // model/moe.cpp: router (no bias), selection bias, shared, experts
    const double E = double(c.moe.experts), Fe = double(c.moe.ffn);
    const double Fs = double(c.moe.shared) * Fe / t;  // the shared experts, split over tp
    p.moe_dense = common + r16(E * C) + r16(E);
    if (c.moe.shared > 0) p.moe_dense += mats * r16(C * Fs) + (b ? r16(Fs) + r16(C) : 0);
    // A routed expert is whole on its ep rank (no tensor parallelism inside an expert).
    const double held = E / ep * (mats * r16(C * Fe) + (b ? r16(Fe) + r16(C) : 0));
    if (ep > 1)
      p.moe_experts = held;
    else
      p.moe_dense += held;
  }
  if (zero >= 1) {
    const double K = double(shard_ranks);
    p.expert_shard_ranks = double(expert_shard_ranks_of(shard_ranks, int64_t(ep)));
    const double align = 16.0 * K, expert_align = 16.0 * p.expert_shard_ranks;
    auto ra = [&](double n, double a) { return std::ceil(n / a) * a; };
    p.embed = ra(p.embed, align), p.block = ra(p.block, align), p.head = ra(p.head, align);
    p.moe_dense = ra(p.moe_dense, align), p.moe_experts = ra(p.moe_experts, expert_align);
  }  // zero = 0: one part per block too, every tensor 16-aligned already
  p.experts = moe_blocks * p.moe_experts;
  p.total = p.embed + (double(c.layers) - moe_blocks) * p.block +
            moe_blocks * (p.moe_dense + p.moe_experts) + p.head;
  return p;
}

double ParamSections::part(const ModelConfig& c, int q) const {
  if (q == 0) return embed;
  if (q == int(c.layers) + 1) return head;
  return c.moe.enabled() && c.moe.is_moe(q - 1) ? moe_dense + moe_experts : block;
}

double ParamSections::piece(const ModelConfig& c, int q, double K) const {
  if (q > 0 && q <= int(c.layers) && c.moe.enabled() && c.moe.is_moe(q - 1))
    return moe_dense / K + moe_experts / expert_shard_ranks;
  return part(c, q) / K;
}

RankLayout RankLayout::make(const RunConfig& run, const GridLayout& grid, int rank,
                            int ep_placed_nodes) {
  RankLayout r = make(ModelConfig::from(run.model, run.train, run.hardware.device), run.parallel, run.train.micro_batch,
                      run.train.global_batch, grid, rank, ep_placed_nodes);
  if (run.train.precision == TrainPrecision::fp16) {
    r.loss_scaling.dynamic = true;
    r.loss_scaling.scale = run.train.loss_scale;
    r.loss_scaling.floor = run.train.loss_scale_min;
    r.loss_scaling.window = run.train.loss_scale_window;
  }
  return r;
}

RankLayout RankLayout::make(const ModelConfig& whole, const ParallelSection& p,
                            int64_t micro_batch, int64_t global_batch, const GridLayout& grid,
                            int rank, int ep_placed_nodes) {
  RankLayout r;
  r.degrees = grid.degrees();
  r.coord = grid.coord(rank);
  const GridDegrees& d = r.degrees;
  r.batch = BatchGeometry::from(micro_batch, global_batch, d.dp);
  ModelConfig& c = r.model;
  c = whole;

  // Tensor parallelism (and sequence parallelism's shard of the residual stream's tokens).
  c.split(TensorParallel{d.tp, r.coord.tp, p.sequence_parallel});
  const int64_t tokens = r.batch.micro_batch * c.seq_len / d.cp;
  TESSERA_REQUIRE(d.tp == 1 || !p.sequence_parallel || tokens % d.tp == 0,
                  "parallel.sequence_parallel shards the ", tokens,
                  " tokens of a micro-batch (train.micro_batch x model.seq_len / parallel.cp) over "
                  "parallel.tp = ",
                  d.tp, " ranks, which does not divide them");
  c.split(ContextParallel{d.cp, r.coord.cp, p.cp_kind});

  // Experts: split over ep, node-limited routing. Expert parallelism divides the routed
  // experts' state (doc/moe.md): each rank registers its ep rank's experts only, reduced (and
  // ZeRO-sharded) over edp.
  c.check_experts(d.ep, d.tp);
  c.limit_nodes(p.ep_nodes, ep_placed_nodes, p.ep_max_nodes);
  if (p.ep_dispatch == EpDispatch::two_level) c.dispatch_two_level(d.ep, ep_placed_nodes);
  if (c.moe.enabled()) c.experts_held = {d.ep, r.coord.ep};

  // The pipeline: its schedule and cut. The micro-batches of a step are those one
  // data-parallel rank accumulates.
  const int stages = d.pp;
  if (stages > 1) {
    r.schedule = {stages, int(r.batch.accum), p.pp_virtual, p.pp_schedule};
    pp::require_valid(r.schedule);
    r.chunk_layers = pp::split_layers(c, r.schedule.model_chunks(), p.pp_layers);
    const int64_t largest = *std::max_element(r.chunk_layers.begin(), r.chunk_layers.end());
    TESSERA_REQUIRE(c.recompute_layers <= largest, "train.recompute_layers = ", c.recompute_layers,
                    " is more than the ", largest, " blocks of the largest model chunk (",
                    r.schedule.model_chunks(), " chunks: parallel.pp x pp_virtual); at most ",
                    largest, " (0: all)");
    r.chunks = pp::stage_layers(r.chunk_layers, r.schedule, r.coord.pp);
  } else {
    r.schedule = {1, int(r.batch.accum), 1, PipeSchedule::one_f_one_b};
    r.chunks = {ChunkLayers{0, c.layers, true, true}};
  }

  // Data parallelism: gradients are summed, and ZeRO shards the model state, over the data-
  // and context-parallel ranks together (dp_cp).
  r.zero = p.zero;
  r.dp_cp = int64_t(d.dp) * d.cp;
  const int64_t k = shard_ranks_of(p.shard_group, r.dp_cp);
  TESSERA_REQUIRE(p.zero == 0 || k % d.ep == 0 || d.ep % k == 0, "parallel.shard_group = ", k,
                  " and parallel.ep = ", d.ep,
                  " do not nest (one must divide the other), so the experts cannot be sharded "
                  "like the rest; choose a shard group that is a multiple or divisor of ep");
  TESSERA_REQUIRE(r.dp_cp % k == 0, "parallel.shard_group = ", k,
                  " does not divide the data-parallel degree ", r.dp_cp);
  TESSERA_REQUIRE(k == r.dp_cp || p.zero >= 1, "parallel.shard_group = ", k,
                  " shards the model state, which needs parallel.zero >= 1");
  r.shard_ranks = p.zero >= 1 ? k : 1;
  r.expert_shard_ranks = p.zero >= 1 ? expert_shard_ranks_of(k, c.experts_held.size) : 1;

  // The parameter elements this rank holds, part by part (DataParallel::store_layout).
  r.sections = param_sections(c, r.zero, r.shard_ranks);
  const int head = int(c.layers) + 1;
  r.part_elements.assign(size_t(head + 1), 0.0);
  const double align = r.zero >= 1 ? 16.0 * double(r.shard_ranks) : 16.0;
  const double table = std::ceil(double(c.vocab_local() * c.d_model) / 16) * 16;
  const bool embedding = std::any_of(r.chunks.begin(), r.chunks.end(),
                                     [](const ChunkLayers& k) { return k.embedding; });
  for (const ChunkLayers& k : r.chunks) {
    if (k.embedding)
      r.part_elements[0] = r.sections.embed;
    else if (k.head && c.tie_embeddings && !embedding)  // the head stage's copy of the table
      r.part_elements[0] = std::ceil(table / align) * align;
    for (int64_t b = k.first; b < k.last; ++b) {
      r.part_elements[size_t(b + 1)] = r.sections.part(c, int(b + 1));
      if (c.moe.enabled() && c.moe.is_moe(b)) r.expert_params += r.sections.moe_experts;
    }
    if (k.head) r.part_elements[size_t(head)] = r.sections.head;
  }
  for (double n : r.part_elements) r.params += n;
  return r;
}

double RankLayout::compute_copy_bytes() const {
  if (model.compute == DType::f32) return 0;
  return zero < 3 ? 2 * params : 2 * params / double(shard_ranks);
}

ModelStateBytes RankLayout::model_state() const {
  const ModelStateBytes d =
      zero_model_state(zero, params - expert_params, double(shard_ranks), false);
  const ModelStateBytes x =
      zero_model_state(zero, expert_params, double(expert_shard_ranks), false);
  return {d.params + x.params + compute_copy_bytes(), d.grads + x.grads,
          d.optimizer + x.optimizer};
}

}  // namespace tessera
