#include "model/moe.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/kernels.hpp"
#include "model/pass_pair.hpp"
#include "model/tensor_parallel.hpp"
#include "model/transfers.hpp"
#include "model/weight_grads.hpp"

namespace tessera {
namespace {

// Rows [first, first + count) of t viewed as [rows, cols], in t's space.
Tensor rows(const Tensor& t, int64_t first, int64_t count, int64_t cols) {
  return t.reshaped(Shape{t.numel() / cols, cols}).rows(first, count);
}
Tensor rows(const Buffer& b, int64_t first, int64_t count, int64_t cols) {
  return rows(b.view(), first, count, cols);
}

// Host reads of f64 data (Tensor::f32 checks the space, not the dtype).
const double* f64(const Tensor& t) {
  return static_cast<const double*>(static_cast<void*>(t.f32()));
}

// In a pair of interleaved passes (model/pass_pair.hpp): the transfers are also timed as the
// pair's `kind`, and a pass gives way to the other micro-batch before it waits for them.
void paired(const StepContext& ctx, StepTransfers& t, PassPair::Kind kind) {
  if (ctx.pair) t.also(&ctx.pair->timing(kind));
}
void await(const StepContext& ctx, StepTransfers& t) {
  if (ctx.pair) ctx.pair->await(t);
}

}  // namespace

Moe::Moe(ParamStore& store, const std::string& name, const ModelConfig& cfg)
    : cfg_(cfg), name_(name), shared_cfg_(cfg), swiglu_(cfg.arch == Arch::llama) {
  const int64_t C = cfg.d_model, F = cfg.moe.ffn, E = cfg.moe.experts;
  const bool bias = cfg.has_bias();
  const float resid_std = cfg.init_std / std::sqrt(2.0f * float(cfg.layers));
  router_ = Linear(store, name + ".router", C, E, false, cfg.init_std);
  bias_ = &store.add(name + ".router.selection_bias", Shape{E}, {ParamInit::zeros}, false);
  if (cfg.moe.shared > 0) {
    shared_cfg_.ffn_hidden = cfg.moe.shared * F;
    shared_ = std::make_unique<Mlp>(store, name + ".shared", shared_cfg_);
  }
  // The routed experts this rank holds (all, or its expert-parallel rank's E/ep), under their
  // global names; sharded ones are marked for the reduction over edp.
  const int64_t held = E / cfg.experts_held.size;
  held_first_ = cfg.experts_held.rank * held;
  const size_t before = store.params().size();
  experts_.resize(size_t(held));
  for (int64_t e = 0; e < held; ++e) {
    const std::string n = name + ".experts." + std::to_string(held_first_ + e);
    Expert& x = experts_[size_t(e)];
    if (swiglu_) x.gate = Linear(store, n + ".gate", C, F, bias, cfg.init_std);
    x.up = Linear(store, n + ".up", C, F, bias, cfg.init_std);
    x.down = Linear(store, n + ".down", F, C, bias, resid_std);
  }
  for (size_t i = before; i < store.params().size(); ++i) {
    routed_elements_ += store.param(int(i)).local.numel();
    if (cfg.experts_held.size > 1) store.param(int(i)).expert = true;
  }
  // Each tensor-parallel rank runs the router's backward and the routed experts on its own
  // tokens only (routed_rows): their gradients are partial sums over tp.
  if (cfg.tp.size > 1)
    for (Param* p : store.params())
      if (p->name == name + ".router.weight" || p->name.rfind(name + ".experts.", 0) == 0)
        p->tp_partial_grad = true;
  step_.load.assign(size_t(E), 0.0);
  last_.load.assign(size_t(E), 0.0);
  mine_.resize(size_t(E));
  sums_.resize(size_t(E) + 8);
}

int Moe::ep_size(const StepContext& ctx) const {
  return ctx.par.ep ? ctx.par.ep->size() : 1;
}

// The rows [first, first + count) of the N a tensor-parallel rank dispatches to the experts:
// its sequence shard under sequence parallelism; without it, where every rank holds all N
// rows, its share N r / t .. N (r + 1) / t, so the routed work is not repeated t times.
std::pair<int64_t, int64_t> Moe::routed_rows(const StepContext& ctx, int64_t N) const {
  const int64_t t = ctx.par.tp.size(), r = ctx.par.tp.rank();
  if (t == 1 || tp::sequence_parallel(ctx)) return {tp::first_row(ctx, N), tp::rows(ctx, N)};
  return {N * r / t, N * (r + 1) / t - N * r / t};
}

void Moe::share(Saved* routed, Mlp::Saved* shared_experts, Recompute mode) {
  rebuilt_ = routed, mode_ = mode;
  if (shared_) shared_->share(shared_experts, mode);
}

Moe::Saved& Moe::kept(const StepContext& ctx) {
  Saved& s = mode_ == Recompute::full ? *rebuilt_ : slots_.at(ctx.slot);
  const int64_t N = ctx.batch * cfg_.seq_local(), E = cfg_.moe.experts, K = cfg_.moe.top_k;
  const int64_t C = cfg_.d_model, F = cfg_.moe.ffn, ep = ep_size(ctx);
  const int64_t Nw = ctx.batch * cfg_.seq_len;  // the routing's tokens: whole sequences (cp)
  if (s.logits.numel() != Nw * E) {
    auto act = [&](Shape shape, DType t = DType::f32) {
      return Buffer(ctx.alloc, shape, t, Charge::activations);
    };
    s.logits = act({Nw, E}), s.scores = act({Nw, E});
    s.choice = act({Nw, K}, DType::i32), s.row = act({Nw, K}, DType::i32), s.weight = act({Nw, K});
    s.f = act({ctx.batch, E});
    s.xin = act({N * K, C}), s.out = act({N * K, C});
    // The expert side holds at most every rank's rows (all sent to this rank's experts).
    const int64_t R = ep * N * K;
    if (ep > 1) s.xe_own = act({R, C}), s.oe_own = act({R, C});
    s.xe = ep > 1 ? s.xe_own.view() : s.xin.view();
    s.oe = ep > 1 ? s.oe_own.view() : s.out.view();
    s.up = act({R, F});
    if (mode_ != Recompute::selective) s.act = act({R, F});
    if (swiglu_) s.gate = act({R, F});
    s.offset.assign(size_t(E) + 1, 0);
    s.counts.assign(size_t(E), 0.0f);
    s.eoffset.assign(size_t(E / ep) + 1, 0);
    for (auto* v : {&s.packed_count, &s.packed_displ, &s.side_count, &s.side_displ})
      v->assign(size_t(ep), 0);
    if (cfg_.moe.two_level) kept_nodes(ctx, s);
  }
  if (cfg_.moe.two_level) node_workspace(ctx);
  return s;
}

Tensor Moe::activation(const StepContext& ctx, Saved& s) {
  if (mode_ != Recompute::selective) return s.act.view();
  const int64_t R = ep_size(ctx) * ctx.batch * cfg_.seq_local() * cfg_.moe.top_k;
  if (rebuilt_->act.numel() != R * cfg_.moe.ffn)
    rebuilt_->act = Buffer(ctx.alloc, Shape{R, cfg_.moe.ffn}, DType::f32, Charge::activations);
  return rebuilt_->act.view();
}

// Scores, top-k selection (by score + bias; ties to the lower expert index), combine weights,
// capacity (per sequence, token order), packed rows, the balancing loss's fractions: kernels
// on the tensors' memory (kernels.hpp, "mixture-of-experts routing"). The host reads back only
// the expert offsets (the all-to-all counts and the experts' GEMM sizes) and, in training, the
// step's statistics.
void Moe::route(StepContext& ctx, Saved& s, int64_t B, int64_t T, int64_t r0, int64_t R) {
  const int64_t N = B * T, E = cfg_.moe.experts, K = cfg_.moe.top_k;
  const bool sigmoid = cfg_.moe.router == Router::sigmoid;
  const bool tally = tally_;  // training, and not a rerun: the same tokens are counted once
  // The cross-node dispatch bytes (doc/moe.md): the nodes the ep ranks really sit on; the
  // experts of this rank's node are [lo, hi).
  // Under the two-level dispatch, the nodes it sends over (parallel.ep_nodes may emulate them).
  const int64_t ep = ep_size(ctx);
  const int64_t placed = cfg_.moe.two_level ? cfg_.moe.nodes : cfg_.moe.placed_nodes;
  const bool count_nodes = placed > 1 && tally;
  const int64_t my_node = (ctx.par.ep ? ctx.par.ep->rank() : 0) * placed / ep;
  const double row_bytes = double(cfg_.d_model) * double(sizeof(float));
  int64_t lo = E, hi = 0;
  for (int64_t e = 0; e < E; ++e)
    if (e / (E / ep) * placed / ep == my_node) lo = std::min(lo, e), hi = e + 1;
  const int64_t cap =
      cfg_.moe.capacity_factor > 0
          ? int64_t(std::ceil(double(cfg_.moe.capacity_factor) * double(T * K) / double(E)))
          : N * K;
  // Work space: per token logsumexp and score sum (f64); per sequence and expert the load,
  // the kept choices (then their first packed rows), the balancing terms; the offsets, the
  // statistics, the unrestricted choices.
  const Tensor tok = ctx.scratch.get(ScratchId::moe_route_tokens, {2, N}, DType::f64);
  const Tensor cnt =
      ctx.scratch.get(ScratchId::moe_route_counts, {2 * B * E + E + 1 + N * K}, DType::i32);
  const Tensor sum = ctx.scratch.get(ScratchId::moe_route_sums, {B * E + E + 4}, DType::f64);
  const Tensor lse = tok.rows(0, 1), norm = sigmoid ? tok.rows(1, 1) : Tensor{};
  const Tensor load = cnt.slice(0, B * E), firsts = cnt.slice(B * E, B * E);
  const Tensor offset = cnt.slice(2 * B * E, E + 1), free = cnt.slice(2 * B * E + E + 1, N * K);
  const Tensor aux = sum.slice(0, B * E), stats = sum.slice(B * E, E + 4);
  const Tensor bias = bias_->value;
  kernels::moe_scores(s.logits.view(), s.scores.view(), lse, norm, N, E, sigmoid);
  if (count_nodes)  // where unrestricted routing would send each token
    kernels::moe_top_k(s.scores.view(), bias, free, Tensor{}, N, E, K, 1, 0, false);
  kernels::moe_top_k(s.scores.view(), bias, s.choice.view(), s.weight.view(), N, E, K,
                     cfg_.moe.nodes, cfg_.moe.max_nodes, sigmoid);
  kernels::moe_capacity(s.choice.view(), load, firsts, s.row.view(), B, T, K, E, cap, r0, R);
  kernels::moe_balance(s.scores.view(), norm, load, s.f.view(), tally ? aux : Tensor{}, B, T, K, E);
  kernels::moe_pack(s.choice.view(), firsts, offset, s.row.view(), B, T, K, E);
  if (tally)
    kernels::moe_route_stats(lse, load, aux, count_nodes ? free : Tensor{}, stats, B, T, K, E, cap,
                             step_.z, step_.aux, r0, R, lo, hi);
  // On the host: each expert's first packed row (needed there for the all-to-all's counts and
  // the experts' GEMMs), and the step's statistics.
  const int32_t* off = ctx.scratch.readable(ScratchId::moe_route_counts, offset).i32();
  for (int64_t e = 0; e <= E; ++e) s.offset[size_t(e)] = off[e];
  if (!tally) return;
  const double* st = f64(ctx.scratch.readable(ScratchId::moe_route_sums, stats));
  for (int64_t e = 0; e < E; ++e) step_.load[size_t(e)] += st[e];
  step_.dropped += st[E];
  step_.z = st[E + 1], step_.tokens += double(N);
  step_.aux = st[E + 2], step_.sequences += double(B);
  if (count_nodes) {
    int64_t away = 0;  // dispatched rows (after capacity) for experts on other nodes
    for (int64_t e = 0; e < E; ++e)
      if (e < lo || e >= hi) away += s.offset[size_t(e) + 1] - s.offset[size_t(e)];
    // The two-level dispatch measures what it sends (nodes_post_dispatch).
    if (!cfg_.moe.two_level) step_.cross_bytes += double(away) * row_bytes;
    step_.cross_bytes_free += st[E + 3] * row_bytes;
    // Once per node: each token's kept choices' distinct other nodes, read from the choices
    // (independently of the two-level dispatch's own bookkeeping, which it checks).
    const int32_t* choice = s.choice.view().i32();
    const int32_t* row = s.row.view().i32();
    seen_.assign(size_t(placed), 0);
    int64_t once = 0;
    for (int64_t n = r0; n < r0 + R; ++n) {
      for (int64_t j = 0; j < K; ++j) {
        if (row[n * K + j] < 0) continue;
        const int64_t node = choice[n * K + j] / (E / ep) * placed / ep;
        if (node != my_node && !seen_[size_t(node)]) seen_[size_t(node)] = 1, ++once;
      }
      for (int64_t j = 0; j < K; ++j) seen_[size_t(choice[n * K + j] / (E / ep) * placed / ep)] = 0;
    }
    step_.cross_bytes_nodes += double(once) * row_bytes;
  }
}

template <class Fn>
void Moe::for_each_chunk(const Saved& s, Fn&& fn) const {
  const int64_t El = int64_t(s.eoffset.size()) - 1, ep = int64_t(s.counts.size()) / El;
  int64_t packed = 0;
  if (s.nodes > 0) {
    // Two-level: relay l's rows arrive as [local expert][source node g] (the relay's
    // node-packed order) and go where the flat dispatch puts source g L + l's rows, so the
    // expert side is the same, row for row.
    const int64_t D = s.nodes, L = ep / D;
    auto count = [&](int64_t src, int64_t e) {
      return int64_t(s.counts[size_t(((src % L) * El + e) * D + src / L)]);
    };
    for (int64_t l = 0; l < L; ++l)
      for (int64_t e = 0; e < El; ++e)
        for (int64_t g = 0; g < D; ++g) {
          int64_t side = s.eoffset[size_t(e)];
          for (int64_t q = 0; q < g * L + l; ++q) side += count(q, e);
          const int64_t n = count(g * L + l, e);
          fn(packed, side, n);
          packed += n;
        }
    return;
  }
  for (int64_t src = 0; src < ep; ++src)
    for (int64_t e = 0; e < El; ++e) {
      int64_t side = s.eoffset[size_t(e)];
      for (int64_t q = 0; q < src; ++q) side += int64_t(s.counts[size_t(q * El + e)]);
      const int64_t n = int64_t(s.counts[size_t(src * El + e)]);
      fn(packed, side, n);
      packed += n;
    }
}

void Moe::exchange_counts(StepContext& ctx, Saved& s) {
  const int64_t E = cfg_.moe.experts, ep = ep_size(ctx), El = E / ep;
  std::vector<float>& mine = mine_;
  for (int64_t e = 0; e < E; ++e)
    mine[size_t(e)] = float(s.offset[size_t(e) + 1] - s.offset[size_t(e)]);
  if (ep > 1)
    ctx.par.ep->all_to_all(mine.data(), s.counts.data(), El);
  else
    s.counts = mine;
  s.eoffset[0] = 0;
  for (int64_t e = 0; e < El; ++e) {
    int64_t n = 0;
    for (int64_t src = 0; src < ep; ++src) n += int64_t(s.counts[size_t(src * El + e)]);
    s.eoffset[size_t(e) + 1] = s.eoffset[size_t(e)] + n;
  }
  // Elements per peer: the packed rows of peer d's experts, and the rows peer d sends here.
  const int64_t C = cfg_.d_model;
  for (int64_t d = 0; d < ep; ++d) {
    const size_t i = size_t(d);
    s.packed_displ[i] = s.offset[size_t(d * El)] * C;
    s.packed_count[i] = s.offset[size_t((d + 1) * El)] * C - s.packed_displ[i];
    s.side_count[i] = 0;
    for (int64_t e = 0; e < El; ++e) s.side_count[i] += int64_t(s.counts[size_t(d * El + e)]) * C;
    s.side_displ[i] = d == 0 ? 0 : s.side_displ[i - 1] + s.side_count[i - 1];
  }
}

Communicator& Moe::expert_group(const StepContext& ctx, const Saved& s) const {
  return s.nodes > 0 ? *ctx.par.ep_intra : *ctx.par.ep;
}

void Moe::to_experts(StepContext& ctx, const Saved& s, const Tensor& packed, const Tensor& side) {
  StepTransfers blocking(nullptr);
  post_to_experts(ctx, s, packed, blocking);
  finish_to_experts(ctx, s, side, blocking);
}

void Moe::from_experts(StepContext& ctx, const Saved& s, const Tensor& side, const Tensor& packed) {
  StepTransfers blocking(nullptr);
  post_from_experts(ctx, s, side, packed, blocking);
  blocking.finish();
}

// The all-to-alls go through the scratch stage (moe_a2a, the expert side's rows), which the
// dispatch fills and the expert side's chunks are copied from (and the combine the other way):
// one of them in flight at a time.
void Moe::post_to_experts(StepContext& ctx, const Saved& s, const Tensor& packed,
                          StepTransfers& transfers) {
  if (ep_size(ctx) == 1) return;
  const Tensor stage = ctx.scratch.get(ScratchId::moe_a2a, {s.xe.shape.dims[0], cfg_.d_model});
  transfers.add(expert_group(ctx, s).all_to_allv_async(packed.f32(), s.packed_count, s.packed_displ,
                                                       stage.f32(), s.side_count, s.side_displ));
}

void Moe::finish_to_experts(StepContext& ctx, const Saved& s, const Tensor& side,
                            StepTransfers& transfers) {
  if (ep_size(ctx) == 1) return;
  transfers.finish();
  const int64_t C = cfg_.d_model;
  const Tensor stage = ctx.scratch.get(ScratchId::moe_a2a, {side.shape.dims[0], C});
  for_each_chunk(s, [&](int64_t from, int64_t to, int64_t n) {
    if (n > 0) kernels::copy(rows(stage, from, n, C), rows(side, to, n, C), n * C);
  });
}

void Moe::post_from_experts(StepContext& ctx, const Saved& s, const Tensor& side,
                            const Tensor& packed, StepTransfers& transfers) {
  if (ep_size(ctx) == 1) return;
  const int64_t C = cfg_.d_model;
  const Tensor stage = ctx.scratch.get(ScratchId::moe_a2a, {side.shape.dims[0], C});
  for_each_chunk(s, [&](int64_t to, int64_t from, int64_t n) {
    if (n > 0) kernels::copy(rows(side, from, n, C), rows(stage, to, n, C), n * C);
  });
  transfers.add(expert_group(ctx, s).all_to_allv_async(
      stage.f32(), s.side_count, s.side_displ, packed.f32(), s.packed_count, s.packed_displ));
}

// This rank's experts on the expert side's rows.
void Moe::run_experts(StepContext& ctx, Saved& s) {
  const int64_t C = cfg_.d_model, F = cfg_.moe.ffn, El = int64_t(s.eoffset.size()) - 1;
  const int64_t first_expert = (ctx.par.ep ? ctx.par.ep->rank() : 0) * El;
  // In 16 bits each expert's GEMM operands are cast into scratch (x: its rows of the expert
  // side, then its activation; dy in backward: its output gradients), as many rows as the
  // routing gave it. The buffers are taken for the worst case, every row of the expert side
  // to one expert, so that the workspace does not depend on the routing (and the planner
  // predicts it to the byte, as it does the experts' other scratch).
  if (const DType t = experts_.empty() ? DType::f32 : experts_.front().up.compute_dtype();
      t != DType::f32) {
    const int64_t Rx = s.xe.shape.dims[0];
    ctx.scratch.get(ScratchId::gemm_x, {Rx, std::max(C, F)}, t);
    ctx.scratch.get(ScratchId::gemm_dy, {Rx, C}, t);
  }
  const Tensor activated = activation(ctx, s);
  for (int64_t e = 0; e < El; ++e) {
    const int64_t first = s.eoffset[size_t(e)], n = s.eoffset[size_t(e) + 1] - first;
    if (n == 0) continue;
    const Expert& x = experts_[size_t(first_expert + e - held_first_)];
    const Tensor xin = x.up.operand(ctx, rows(s.xe, first, n, C));  // cast once for both maps
    const Tensor act = rows(activated, first, n, F), up = rows(s.up, first, n, F);
    // The fused epilogue (as the dense Mlp's): the biases, the activation and, when down
    // multiplies in 16 bits, its operand, in one pass; act stays fp32 for down's weight
    // gradient.
    x.up.forward_gemm(ctx, xin, up);
    const Tensor gate = swiglu_ ? rows(s.gate, first, n, F) : Tensor{};
    if (swiglu_) x.gate.forward_gemm(ctx, xin, gate);
    // xin is consumed: its scratch buffer takes down's operand.
    const DType t = x.down.compute_dtype();
    const Tensor act16 = t == DType::f32 ? Tensor{} : ctx.scratch.get(ScratchId::gemm_x, {n, F}, t);
    if (swiglu_) {
      kernels::swiglu_bias_forward(gate, up, x.gate.bias(), x.up.bias(), act, act16, n, F);
    } else {
      kernels::gelu_bias_forward(up, x.up.bias(), act, act16, n, F);
    }
    x.down.forward(ctx, act16.data ? act16 : act, rows(s.oe, first, n, C));
  }
}

// Tensor parallelism (doc/moe.md): the router is replicated and every tp rank routes all N
// tokens of the micro-batch (gathered first under sequence parallelism), so the capacity and
// the balancing loss see whole sequences and agree bit for bit across tp ranks; each rank then
// dispatches only its own rows [r0, r0 + R) (all N without sequence parallelism). The shared
// experts are the column/row-parallel Mlp.
void Moe::forward(StepContext& ctx, const Tensor& x_rows, const Tensor& y, bool rerun) {
  const int64_t B = ctx.batch, T = cfg_.seq_local(), N = B * T, K = cfg_.moe.top_k;
  const int64_t C = cfg_.d_model, r0 = tp::first_row(ctx, N);  // y holds rows [r0, ...)
  const auto [q0, Q] = routed_rows(ctx, N);                    // the rows this rank dispatches
  const Tensor x =
      tp::gather(ctx, x_rows,
                 ctx.scratch.get(ScratchId::sp_gathered, {tp::sequence_parallel(ctx) ? N * C : 1}));
  Saved& s = kept(ctx);
  // Context parallelism: every cp rank routes the whole sequences (the statistics counted by
  // cp rank 0), then keeps the packed rows of its own tokens (moe_context_parallel.cpp).
  const bool whole = cp_size(ctx) > 1;
  tally_ = ctx.training && !rerun && (!whole || ctx.par.cp->rank() == 0);
  const Tensor xw = whole ? gather_sequences(ctx, x) : x;
  router_.forward(ctx, xw, s.logits.view());
  if (whole) {
    route(ctx, s, B, cfg_.seq_len, 0, B * cfg_.seq_len);
    own_rows(ctx, s, q0, Q);
  } else {
    route(ctx, s, B, T, q0, Q);
  }
  // y += the shared experts' output first, then the routed experts' (the order of the sums).
  // The shared experts run in two halves behind the all-to-alls (doc/moe-overlap.md): their
  // gate and up GEMMs while the dispatch travels, their activation, down and tp sum while the
  // combine does (with the two-level dispatch, the cross-node legs).
  StepTransfers dispatch(ctx.par.ep_timing), combine(ctx.par.ep_timing);
  paired(ctx, dispatch, PassPair::forward_dispatch),
      paired(ctx, combine, PassPair::forward_combine);
  auto behind = [&](StepTransfers& transfers, auto&& work) {
    if (!shared_) return;
    ctx.in_flight = &transfers;
    work();
    ctx.in_flight = nullptr;
  };
  if (s.nodes > 0) {
    nodes_post_dispatch(ctx, s, x, q0, Q, dispatch);
    behind(dispatch, [&] { shared_->forward_hidden(ctx, x); });
    nodes_fan_out(ctx, s, dispatch);
    run_experts(ctx, s);
    nodes_post_combine(ctx, s, combine);
  } else {
    if (whole)
      for (const Run& u : runs(ctx, q0, Q))
        kernels::moe_gather(xw, s.row.view(), s.xin.view(), u.n, u.count, K, C);
    else
      kernels::moe_gather(x, s.row.view(), s.xin.view(), q0, Q, K, C);
    exchange_counts(ctx, s);
    post_to_experts(ctx, s, s.xin.view(), dispatch);
    behind(dispatch, [&] { shared_->forward_hidden(ctx, x); });
    await(ctx, dispatch);  // in a pair: the other micro-batch computes while it travels
    finish_to_experts(ctx, s, s.xe, dispatch);
    run_experts(ctx, s);
    post_from_experts(ctx, s, s.oe, s.out.view(), combine);
  }
  behind(combine, [&] { shared_->forward_output(ctx, y); });
  await(ctx, combine);
  combine.finish();
  // Without sequence parallelism every rank needs every row's routed output: each fills its
  // own rows of a zeroed N x C buffer and the buffers are summed over tp.
  const bool gather = Q != tp::rows(ctx, N);
  const Tensor routed = gather ? ctx.scratch.get(ScratchId::moe_tp_rows, {N, C}) : y;
  if (gather) kernels::fill(routed, 0.0f, N * C);
  // routed holds the rows from token (gather ? 0 : r0) of the N.
  if (s.nodes > 0)  // y[n] += each node's weighted sum (src_rows_), nodes in order
    kernels::moe_combine(src_rows_.view(), s.table.view(), Tensor{},
                         rows(routed, q0 - (gather ? 0 : r0), Q, C), 0, Q, 0, s.nodes, C);
  else
    for (const Run& u : runs(ctx, q0, Q))  // token u.n is local row u.l
      kernels::moe_combine(s.out.view(), s.row.view(), s.weight.view(), routed, u.n, u.count,
                           u.n - u.l + (gather ? 0 : r0), K, C);
  if (gather) {
    ctx.par.tp.all_reduce(routed);
    kernels::add_inplace(y, routed, N * C);
  }
}

void Moe::backward(StepContext& ctx, const Tensor& x_rows, const Tensor& dy, const Tensor& dx) {
  const int64_t B = ctx.batch, T = cfg_.seq_local(), N = B * T, K = cfg_.moe.top_k;
  const int64_t C = cfg_.d_model, F = cfg_.moe.ffn, E = cfg_.moe.experts;
  const int64_t r0 = tp::first_row(ctx, N);  // dy and dx hold rows [r0, ...)
  const auto [q0, Q] = routed_rows(ctx, N);  // the rows this rank dispatched
  Saved& s = kept(ctx);
  // d(expert output) = w dy; d(w) = dy . expert output (this rank's rows; dy from token r0).
  const Tensor d_out = ctx.scratch.get(ScratchId::moe_d_out, {N * K, C});
  const Tensor dw = ctx.scratch.get(ScratchId::moe_d_weight, {B * cfg_.seq_len, K});
  // (token u.n of the whole sequences is local row u.l: one run without context parallelism)
  if (s.nodes == 0)
    for (const Run& u : runs(ctx, q0, Q))
      kernels::moe_combine_backward(dy, s.out.view(), s.row.view(), s.weight.view(), d_out, dw, u.n,
                                    u.count, u.n - u.l + r0, K, C);
  // The routed experts, each on its rows of the expert side: d(expert input) there, then
  // back to the packed side (moe_d_in).
  const int64_t El = int64_t(s.eoffset.size()) - 1, Rx = s.xe.shape.dims[0];
  const int64_t first_expert = (ctx.par.ep ? ctx.par.ep->rank() : 0) * El;
  const bool ep = ep_size(ctx) > 1;
  const Tensor d_in = ctx.scratch.get(ScratchId::moe_d_in, {N * K, C});
  const Tensor d_oe = ep ? ctx.scratch.get(ScratchId::moe_d_side_out, {Rx, C}) : d_out;
  const Tensor d_xe = ep ? ctx.scratch.get(ScratchId::moe_d_side_in, {Rx, C}) : d_in;
  // dx = the shared experts' (reduced over tp), then the router's and the routed experts' (each
  // token's in rank order), the last two on this rank's rows. With the flat dispatch the shared
  // experts' backward runs while the output gradients travel to the experts.
  // The routed experts' hidden gradients' scratch is taken first, before the shared experts
  // (which share it) run, as the planner replays it (perf/activation_memory.cpp). The views
  // are taken again after them: a wider shared request would move the buffers.
  const DType t = experts_.empty() ? DType::f32 : experts_.front().up.compute_dtype();
  const bool half = t != DType::f32;
  ctx.scratch.get(ScratchId::mlp_d_act, {Rx, F});
  hidden_grad(ctx, ScratchId::mlp_d_up, Rx, F, t);
  hidden_grad(ctx, ScratchId::mlp_d_gate, swiglu_ ? Rx : 1, F, t);
  // (Two-level: the output gradients' cross-node leg behind the shared experts, the combine
  // weights' gradients' return behind the routed experts.)
  StepTransfers dispatch(ctx.par.ep_timing), weights(ctx.par.ep_timing);
  paired(ctx, dispatch, PassPair::backward_dispatch);
  if (s.nodes > 0)
    nodes_backward_post(ctx, s, rows(dy, q0 - r0, Q, C), Q, dispatch);
  else
    post_to_experts(ctx, s, d_out, dispatch);
  if (shared_) {
    const bool sp = tp::sequence_parallel(ctx);
    const Tensor x =
        tp::gather(ctx, x_rows, ctx.scratch.get(ScratchId::sp_gathered, {sp ? N * C : 1}));
    const Tensor dyg =
        tp::gather(ctx, dy, ctx.scratch.get(ScratchId::sp_gathered_grad, {sp ? N * C : 1}));
    ctx.in_flight = &dispatch;
    shared_->backward(ctx, x, dyg, dx);
    ctx.in_flight = nullptr;
  }
  await(ctx, dispatch);
  if (s.nodes > 0)
    nodes_backward_fan_out(ctx, s, dispatch, d_oe, weights);
  else
    finish_to_experts(ctx, s, d_oe, dispatch);
  // The hidden gradients as the dense Mlp's: one fused pass writes them (in 16 bits only the
  // GEMMs' operands, at the start of the fp32 buffers) and adds the bias gradients.
  const Tensor d_act = ctx.scratch.get(ScratchId::mlp_d_act, {Rx, F});
  const Tensor d_up = hidden_grad(ctx, ScratchId::mlp_d_up, Rx, F, t);
  const Tensor d_gate = hidden_grad(ctx, ScratchId::mlp_d_gate, swiglu_ ? Rx : 1, F, t);
  const Tensor none, activated = activation(ctx, s);
  // A split backward's B (model/weight_grads.hpp): the experts' weight-gradient operands go to
  // regions of the set sized for the worst routing (the expert side's Rx rows), each expert's
  // at its rows: down's dy and x, (gate's dy,) up's dy, and the input gate and up share.
  WeightGrads* wg = ctx.weight_grads;
  Tensor k_doe, k_act, k_dg, k_du, k_x;
  // The experts' 16-bit operand casts, taken for the worst routing as run_experts takes them:
  // a pair's backward_input has a scratch space of its own (model/pass_pair.hpp).
  if (half) {
    ctx.scratch.get(ScratchId::gemm_x, {Rx, std::max(C, F)}, t);
    ctx.scratch.get(ScratchId::gemm_dy, {Rx, C}, t);
  }
  if (wg) {
    k_doe = wg->region(ctx.alloc, Rx * C, t), k_act = wg->region(ctx.alloc, Rx * F, t);
    if (swiglu_) k_dg = wg->region(ctx.alloc, Rx * F, t);
    k_du = wg->region(ctx.alloc, Rx * F, t), k_x = wg->region(ctx.alloc, Rx * C, t);
  }
  ctx.in_flight = &weights;  // (empty but for the two-level dispatch)
  for (int64_t e = 0; e < El; ++e) {
    const int64_t first = s.eoffset[size_t(e)], n = s.eoffset[size_t(e) + 1] - first;
    if (n == 0) continue;
    const Expert& ex = experts_[size_t(first_expert + e - held_first_)];
    const Tensor up = rows(s.up, first, n, F), da = rows(d_act, first, n, F);
    const Tensor du = d_up.rows(first, n), dxe = rows(d_xe, first, n, C);
    const Tensor act = rows(activated, first, n, F);
    // Selective recompute: the activation output again, from the kept pre-activations (the
    // forward's pass left the biases in them), with the forward's kernel.
    if (mode_ == Recompute::selective && swiglu_)
      kernels::swiglu_bias_forward(rows(s.gate, first, n, F), up, none, none, act, none, n, F);
    else if (mode_ == Recompute::selective)
      kernels::gelu_bias_forward(up, none, act, none, n, F);
    if (wg) wg->into(rows(k_doe, first, n, C), rows(k_act, first, n, F));
    ex.down.backward(ctx, act, rows(d_oe, first, n, C), da);
    const Tensor xin = ex.up.operand(ctx, rows(s.xe, first, n, C));
    if (swiglu_) {
      const Tensor dg = d_gate.rows(first, n);
      kernels::swiglu_bias_backward(da, rows(s.gate, first, n, F), up, half ? none : dg,
                                    half ? none : du, half ? dg : none, half ? du : none,
                                    ex.gate.bias_grad(), ex.up.bias_grad(), n, F);
      if (wg) wg->into(rows(k_dg, first, n, F), rows(k_x, first, n, C));
      ex.gate.backward_gemms(ctx, xin, dg, dxe);
      if (wg) wg->into(rows(k_du, first, n, F), rows(k_x, first, n, C));
      ex.up.backward_gemms(ctx, xin, du, dxe, /*accumulate_dx=*/true);
    } else {
      kernels::gelu_bias_backward(da, up, half ? none : du, half ? du : none, ex.up.bias_grad(), n,
                                  F);
      if (wg) wg->into(rows(k_du, first, n, F), rows(k_x, first, n, C));
      ex.up.backward_gemms(ctx, xin, du, dxe);
    }
  }
  ctx.in_flight = nullptr;
  if (s.nodes > 0) nodes_backward_weights(s, q0, Q, dw, weights);
  // The input gradients go back to the sources while the router's backward runs.
  StepTransfers back(ctx.par.ep_timing);
  paired(ctx, back, PassPair::backward_return);
  if (s.nodes > 0)
    nodes_backward_combine(ctx, s, d_xe, back);
  else
    post_from_experts(ctx, s, d_xe, d_in, back);
  const Tensor dl = ctx.scratch.get(ScratchId::moe_d_logits, {Q, E});
  // d(objective)/d(router logits): the combine weights, the balancing loss, the z-loss.
  const double aux = double(cfg_.moe.aux_loss) * double(ctx.loss_scale);
  const double zc = 2.0 * double(cfg_.moe.z_loss) * double(ctx.loss_scale);
  for (const Run& u : runs(ctx, q0, Q))
    kernels::moe_router_backward(s.logits.view(), s.scores.view(), s.choice.view(), s.weight.view(),
                                 dw, s.f.view(), dl.rows(u.l - q0, u.count), u.n, u.count,
                                 cfg_.seq_len, E, K, cfg_.moe.router == Router::sigmoid, aux, zc);
  // Without sequence parallelism the router's and the routed experts' input gradients of this
  // rank's rows go into a zeroed N x C buffer, summed over tp, then added to every row of dx.
  const bool gather = Q != tp::rows(ctx, N);
  const Tensor own = gather ? ctx.scratch.get(ScratchId::moe_tp_rows, {N, C}) : dx;
  if (gather) kernels::fill(own, 0.0f, N * C);
  const int64_t o0 = gather ? q0 : 0;  // the first of this rank's rows in `own`
  ctx.in_flight = &back;
  router_.backward(ctx, x_rows.rows(gather ? q0 : 0, Q), dl, own.rows(o0, Q),
                   /*accumulate_dx=*/!gather && shared_ != nullptr);
  ctx.in_flight = nullptr;
  await(ctx, back);
  back.finish();
  // own holds the rows from token (gather ? 0 : r0) of the N.
  if (s.nodes > 0)
    kernels::moe_combine(src_rows_.view(), s.table.view(), Tensor{},
                         rows(own, q0 - (gather ? 0 : r0), Q, C), 0, Q, 0, s.nodes, C);
  else
    for (const Run& u : runs(ctx, q0, Q))
      kernels::moe_combine(d_in, s.row.view(), Tensor{}, own, u.n, u.count,
                           u.n - u.l + (gather ? 0 : r0), K, C);
  if (gather) {
    ctx.par.tp.all_reduce(own);
    if (shared_)
      kernels::add_inplace(dx, own, N * C);
    else
      kernels::copy(own, dx, N * C);
  }
}

const Moe::Stats& Moe::end_step(Communicator& dp, bool applied) {
  const size_t E = step_.load.size();
  std::vector<double>& v = sums_;  // sized once: E + 8
  std::copy(step_.load.begin(), step_.load.end(), v.begin());
  const double tail[8] = {step_.dropped,
                          step_.aux,
                          step_.z,
                          step_.sequences,
                          step_.tokens,
                          step_.cross_bytes,
                          step_.cross_bytes_free,
                          step_.cross_bytes_nodes};
  std::copy(tail, tail + 8, v.begin() + std::ptrdiff_t(E));
  if (dp.size() > 1) dp.all_reduce(v.data(), int64_t(v.size()));
  last_.load.assign(v.begin(), v.begin() + std::ptrdiff_t(E));
  last_.dropped = v[E], last_.aux = v[E + 1], last_.z = v[E + 2];
  last_.sequences = v[E + 3], last_.tokens = v[E + 4];
  last_.cross_bytes = v[E + 5], last_.cross_bytes_free = v[E + 6];
  last_.cross_bytes_nodes = v[E + 7];
  last_.run_cross_bytes += last_.cross_bytes, last_.run_cross_bytes_free += last_.cross_bytes_free;
  last_.run_cross_bytes_nodes += last_.cross_bytes_nodes;
  std::fill(step_.load.begin(), step_.load.end(), 0.0);
  step_.dropped = step_.aux = step_.z = step_.sequences = step_.tokens = 0;
  step_.cross_bytes = step_.cross_bytes_free = step_.cross_bytes_nodes = 0;
  // Auxiliary-loss-free balancing: an expert above the mean load is selected less often.
  // Every rank computes the same update from the summed loads; under ZeRO-3, which holds the
  // bias only while its block runs, the trainer adds it to the shard (held_bias_update).
  float* bias = bias_->value.f32();
  held_bias_update_.clear();
  if (applied && cfg_.moe.bias_step > 0 && last_.tokens > 0) {
    double mean = 0;
    for (double x : last_.load) mean += x / double(E);
    std::vector<float>& update = held_bias_update_;
    update.resize(E);
    for (size_t e = 0; e < E; ++e) {
      const double gap = mean - last_.load[e];
      update[e] = gap > 0 ? cfg_.moe.bias_step : gap < 0 ? -cfg_.moe.bias_step : 0.0f;
    }
    if (bias) {
      for (size_t e = 0; e < E; ++e) bias[e] += update[e];
      update.clear();
    }
  }
  if (bias == nullptr) return last_;  // no range under ZeRO-3
  last_.bias_min = *std::min_element(bias, bias + E);
  last_.bias_max = *std::max_element(bias, bias + E);
  return last_;
}

double Moe::imbalance() const {
  double sum = 0, most = 0;
  for (double x : last_.load) sum += x, most = std::max(most, x);
  return sum > 0 ? most * double(last_.load.size()) / sum : 0.0;
}

}  // namespace tessera
