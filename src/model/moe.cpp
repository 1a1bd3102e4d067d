#include "model/moe.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "kernels/kernels.hpp"
#include "model/tensor_parallel.hpp"

namespace tessera {
namespace {

Tensor rows(const Tensor& t, int64_t first, int64_t count, int64_t cols) {
  return view_of(t.f32() + first * cols, Shape{count, cols});
}
Tensor rows(const Buffer& b, int64_t first, int64_t count, int64_t cols) {
  return rows(b.view(), first, count, cols);
}

// logsumexp and softmax of one row of n logits.
double softmax_row(const float* l, float* p, int64_t n) {
  float mx = l[0];
  for (int64_t e = 1; e < n; ++e) mx = std::max(mx, l[e]);
  double sum = 0;
  for (int64_t e = 0; e < n; ++e) sum += std::exp(double(l[e] - mx));
  for (int64_t e = 0; e < n; ++e) p[e] = float(std::exp(double(l[e] - mx)) / sum);
  return double(mx) + std::log(sum);
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
  key_.resize(size_t(E)), ds_.resize(size_t(E)), mine_.resize(size_t(E));
  used_.resize(size_t(E)), fill_.resize(size_t(E));
  sums_.resize(size_t(E) + 7);
  node_score_.resize(size_t(cfg.moe.nodes)), node_keep_.resize(size_t(cfg.moe.nodes));
  node_top_.resize(size_t(E / cfg.moe.nodes));
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

Moe::Saved& Moe::kept(const StepContext& ctx) {
  Saved& s = slots_.at(ctx.slot);
  const int64_t N = ctx.batch * cfg_.seq_local(), E = cfg_.moe.experts, K = cfg_.moe.top_k;
  const int64_t C = cfg_.d_model, F = cfg_.moe.ffn, ep = ep_size(ctx);
  if (s.logits.numel() != N * E) {
    auto act = [&](Shape shape, DType t = DType::f32) {
      return Buffer(ctx.alloc, shape, t, Charge::activations);
    };
    s.logits = act({N, E}), s.scores = act({N, E});
    s.choice = act({N, K}, DType::i32), s.row = act({N, K}, DType::i32), s.weight = act({N, K});
    s.f = act({ctx.batch, E});
    s.xin = act({N * K, C}), s.out = act({N * K, C});
    // The expert side holds at most every rank's rows (all sent to this rank's experts).
    const int64_t R = ep * N * K;
    if (ep > 1) s.xe_own = act({R, C}), s.oe_own = act({R, C});
    s.xe = ep > 1 ? s.xe_own.view() : s.xin.view();
    s.oe = ep > 1 ? s.oe_own.view() : s.out.view();
    s.up = act({R, F}), s.act = act({R, F});
    if (swiglu_) s.gate = act({R, F});
    s.offset.assign(size_t(E) + 1, 0);
    s.counts.assign(size_t(E), 0.0f);
    s.eoffset.assign(size_t(E / ep) + 1, 0);
    for (auto* v : {&s.packed_count, &s.packed_displ, &s.side_count, &s.side_displ})
      v->assign(size_t(ep), 0);
  }
  return s;
}

// Scores, top-k selection (by score + bias; ties to the lower expert index), combine weights,
// capacity (per sequence, token order), packed rows, the balancing loss's fractions.
void Moe::route(StepContext& ctx, Saved& s, int64_t B, int64_t T, int64_t r0, int64_t R) {
  const int64_t N = B * T, E = cfg_.moe.experts, K = cfg_.moe.top_k;
  const bool sigmoid = cfg_.moe.router == Router::sigmoid;
  const float* l = s.logits.f32();
  float* sc = s.scores.f32();
  int32_t* choice = s.choice.i32();
  int32_t* row = s.row.i32();
  float* w = s.weight.f32();
  const float* bias = bias_->value.f32();
  const bool training = ctx.training;
  std::vector<float>& key = key_;
  std::vector<int64_t>& used = used_;
  std::vector<int64_t>& fill = fill_;
  // The cross-node dispatch bytes (doc/moe.md): the nodes the ep ranks really sit on.
  const int64_t ep = ep_size(ctx), placed = cfg_.moe.placed_nodes;
  const bool count_nodes = placed > 1;
  const int64_t my_node = (ctx.par.ep ? ctx.par.ep->rank() : 0) * placed / ep;
  const double row_bytes = double(cfg_.d_model) * double(sizeof(float));
  auto node_of_expert = [&](int64_t e) { return e / (E / ep) * placed / ep; };
  const int64_t cap =
      cfg_.moe.capacity_factor > 0
          ? int64_t(std::ceil(double(cfg_.moe.capacity_factor) * double(T * K) / double(E)))
          : N * K;
  std::fill(s.offset.begin(), s.offset.end(), 0);
  for (int64_t n = 0; n < N; ++n) {
    const float* ln = l + n * E;
    float* sn = sc + n * E;
    // key holds softmax(l) first: the scores of the softmax router, z for either.
    const double z = softmax_row(ln, key.data(), E);
    if (sigmoid)
      for (int64_t e = 0; e < E; ++e) sn[e] = 1.0f / (1.0f + std::exp(-ln[e]));
    else
      std::copy(key.begin(), key.end(), sn);
    if (training) step_.z += z * z, step_.tokens += 1;
    for (int64_t e = 0; e < E; ++e) key[size_t(e)] = sn[e] + bias[e];
    const bool own = n >= r0 && n < r0 + R;
    if (count_nodes && own && training) {  // where unrestricted routing would send the token
      top_k(key.data(), choice + n * K);
      for (int64_t j = 0; j < K; ++j)
        if (node_of_expert(choice[n * K + j]) != my_node) step_.cross_bytes_free += row_bytes;
    }
    if (cfg_.moe.node_limited()) limit_to_nodes(key.data());
    top_k(key.data(), choice + n * K);
    double sum = 0;
    for (int64_t j = 0; j < K; ++j) {
      const int32_t best = choice[n * K + j];
      w[n * K + j] = sn[best];
      sum += sn[best];
    }
    if (sigmoid)
      for (int64_t j = 0; j < K; ++j) w[n * K + j] = float(double(w[n * K + j]) / sum);
  }
  // Capacity and counts: sequence by sequence, tokens in order, a token's experts in rank
  // order; the balancing loss's f_i = E / (K T) x tokens of the sequence selecting i.
  float* f = s.f.f32();
  int64_t dropped = 0;
  for (int64_t b = 0; b < B; ++b) {
    std::fill(used.begin(), used.end(), 0);
    for (int64_t n = b * T; n < (b + 1) * T; ++n)
      for (int64_t j = 0; j < K; ++j) {
        const int32_t e = choice[n * K + j];
        const bool keep = used[size_t(e)]++ < cap;
        // Packed (dispatched) only when the token is one of this rank's rows.
        const bool own = n >= r0 && n < r0 + R;
        row[n * K + j] = keep && own ? 0 : -1;
        if (keep && own) ++s.offset[size_t(e) + 1];
        if (!keep) ++dropped;
        if (keep && own && count_nodes && training && node_of_expert(e) != my_node)
          step_.cross_bytes += row_bytes;
      }
    for (int64_t e = 0; e < E; ++e) {
      f[b * E + e] = float(double(E) / double(K * T) * double(used[size_t(e)]));
      if (training) step_.load[size_t(e)] += double(used[size_t(e)]);
    }
  }
  for (int64_t e = 0; e < E; ++e) s.offset[size_t(e) + 1] += s.offset[size_t(e)];
  for (int64_t e = 0; e < E; ++e) fill[size_t(e)] = s.offset[size_t(e)];
  for (int64_t n = r0; n < r0 + R; ++n)
    for (int64_t j = 0; j < K; ++j)
      if (row[n * K + j] == 0) row[n * K + j] = int32_t(fill[size_t(choice[n * K + j])]++);
  if (!training) return;
  step_.dropped += double(dropped);
  // The balancing loss of each sequence: sum_i f_i P_i, P_i the mean over its tokens of the
  // normalised score (the softmax probability; sigmoid scores over their sum).
  for (int64_t b = 0; b < B; ++b) {
    double aux = 0;
    for (int64_t e = 0; e < E; ++e) {
      double P = 0;
      for (int64_t n = b * T; n < (b + 1) * T; ++n) {
        const float* sn = sc + n * E;
        double norm = 1;
        if (sigmoid) {
          norm = 0;
          for (int64_t i = 0; i < E; ++i) norm += sn[i];
        }
        P += sn[e] / norm;
      }
      aux += f[b * E + e] * P / double(T);
    }
    step_.aux += aux;
    step_.sequences += 1;
  }
}

// The k highest keys, in order; equal keys to the lower expert index.
void Moe::top_k(const float* key, int32_t* out) {
  const int64_t E = cfg_.moe.experts, K = cfg_.moe.top_k;
  std::fill(fill_.begin(), fill_.end(), 0);
  for (int64_t j = 0; j < K; ++j) {
    int64_t best = -1;  // the highest key not yet taken, the lowest index among equals
    for (int64_t e = 0; e < E; ++e)
      if (!fill_[size_t(e)] && (best < 0 || key[e] > key[size_t(best)])) best = e;
    fill_[size_t(best)] = 1;
    out[j] = int32_t(best);
  }
}

// Node-limited routing (DeepSeek-V3): node g holds experts [g E/G, (g+1) E/G); its score is
// the sum of its q = min(ceil(k / M), E/G) highest keys (in descending order, in float); the
// M best nodes are kept (equal scores to the lower node) and every other expert's key becomes
// -inf.
void Moe::limit_to_nodes(float* key) {
  const int64_t E = cfg_.moe.experts, K = cfg_.moe.top_k, G = cfg_.moe.nodes;
  const int64_t M = cfg_.moe.max_nodes, per = E / G, q = std::min((K + M - 1) / M, per);
  std::vector<float>& score = node_score_;
  std::vector<float>& top = node_top_;
  for (int64_t g = 0; g < G; ++g) {
    std::copy(key + g * per, key + (g + 1) * per, top.begin());
    std::partial_sort(top.begin(), top.begin() + q, top.begin() + per, std::greater<float>());
    float sum = 0;
    for (int64_t i = 0; i < q; ++i) sum += top[size_t(i)];
    score[size_t(g)] = sum;
  }
  std::fill(node_keep_.begin(), node_keep_.end(), 0);
  for (int64_t m = 0; m < M; ++m) {
    int64_t best = -1;
    for (int64_t g = 0; g < G; ++g)
      if (!node_keep_[size_t(g)] && (best < 0 || score[size_t(g)] > score[size_t(best)])) best = g;
    node_keep_[size_t(best)] = 1;
  }
  for (int64_t e = 0; e < E; ++e)
    if (!node_keep_[size_t(e / per)]) key[e] = -std::numeric_limits<float>::infinity();
}

template <class Fn>
void Moe::for_each_chunk(const Saved& s, Fn&& fn) const {
  const int64_t El = int64_t(s.eoffset.size()) - 1, ep = int64_t(s.counts.size()) / El;
  int64_t packed = 0;
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

void Moe::to_experts(StepContext& ctx, const Saved& s, const Tensor& packed, const Tensor& side) {
  if (ep_size(ctx) == 1) return;
  const int64_t C = cfg_.d_model;
  const Tensor stage = ctx.scratch.get(ScratchId::moe_a2a, {side.shape.dims[0], C});
  ctx.par.ep->all_to_allv(packed.f32(), s.packed_count, s.packed_displ, stage.f32(), s.side_count,
                          s.side_displ);
  for_each_chunk(s, [&](int64_t from, int64_t to, int64_t n) {
    std::copy(stage.f32() + from * C, stage.f32() + (from + n) * C, side.f32() + to * C);
  });
}

void Moe::from_experts(StepContext& ctx, const Saved& s, const Tensor& side, const Tensor& packed) {
  if (ep_size(ctx) == 1) return;
  const int64_t C = cfg_.d_model;
  const Tensor stage = ctx.scratch.get(ScratchId::moe_a2a, {side.shape.dims[0], C});
  for_each_chunk(s, [&](int64_t to, int64_t from, int64_t n) {
    std::copy(side.f32() + from * C, side.f32() + (from + n) * C, stage.f32() + to * C);
  });
  ctx.par.ep->all_to_allv(stage.f32(), s.side_count, s.side_displ, packed.f32(), s.packed_count,
                          s.packed_displ);
}

// This rank's experts on the expert side's rows.
void Moe::run_experts(StepContext& ctx, Saved& s) {
  const int64_t C = cfg_.d_model, F = cfg_.moe.ffn, El = int64_t(s.eoffset.size()) - 1;
  const int64_t first_expert = (ctx.par.ep ? ctx.par.ep->rank() : 0) * El;
  for (int64_t e = 0; e < El; ++e) {
    const int64_t first = s.eoffset[size_t(e)], n = s.eoffset[size_t(e) + 1] - first;
    if (n == 0) continue;
    const Expert& x = experts_[size_t(first_expert + e - held_first_)];
    const Tensor xin = x.up.operand(ctx, rows(s.xe, first, n, C));  // cast once for both maps
    const Tensor act = rows(s.act, first, n, F), up = rows(s.up, first, n, F);
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
void Moe::forward(StepContext& ctx, const Tensor& x_rows, const Tensor& y) {
  const int64_t B = ctx.batch, T = cfg_.seq_local(), N = B * T, K = cfg_.moe.top_k;
  const int64_t C = cfg_.d_model, r0 = tp::first_row(ctx, N);  // y holds rows [r0, ...)
  const auto [q0, Q] = routed_rows(ctx, N);  // the rows this rank dispatches
  const Tensor x =
      tp::gather(ctx, x_rows,
                 ctx.scratch.get(ScratchId::sp_gathered, {tp::sequence_parallel(ctx) ? N * C : 1}));
  Saved& s = kept(ctx);
  router_.forward(ctx, x, s.logits.view());
  route(ctx, s, B, T, q0, Q);
  const float* xf = x.f32();
  const int32_t* row = s.row.i32();
  for (int64_t n = q0; n < q0 + Q; ++n)
    for (int64_t j = 0; j < K; ++j)
      if (const int32_t r = row[n * K + j]; r >= 0)
        std::copy(xf + n * C, xf + (n + 1) * C, s.xin.f32() + int64_t(r) * C);
  exchange_counts(ctx, s);
  to_experts(ctx, s, s.xin.view(), s.xe);
  run_experts(ctx, s);
  from_experts(ctx, s, s.oe, s.out.view());
  if (shared_) shared_->forward(ctx, x, y);
  // Without sequence parallelism every rank needs every row's routed output: each fills its
  // own rows of a zeroed N x C buffer and the buffers are summed over tp.
  const bool gather = Q != tp::rows(ctx, N);
  const Tensor routed = gather ? ctx.scratch.get(ScratchId::moe_tp_rows, {N, C}) : y;
  if (gather) kernels::fill(routed, 0.0f, N * C);
  float* yf = routed.f32() - (gather ? 0 : r0) * C;  // indexed by the token's row among the N
  const float* w = s.weight.f32();
  for (int64_t n = q0; n < q0 + Q; ++n)
    for (int64_t j = 0; j < K; ++j)
      if (const int32_t r = row[n * K + j]; r >= 0) {
        const float* o = s.out.f32() + int64_t(r) * C;
        for (int64_t c = 0; c < C; ++c) yf[n * C + c] += w[n * K + j] * o[c];
      }
  if (gather) {
    ctx.par.tp.all_reduce(routed);
    kernels::add_inplace(y, routed, N * C);
  }
}

void Moe::router_grad(StepContext& ctx, Saved& s, const float* dw, const Tensor& dl, int64_t T,
                      int64_t r0, int64_t R) {
  const int64_t E = cfg_.moe.experts, K = cfg_.moe.top_k;
  const bool sigmoid = cfg_.moe.router == Router::sigmoid;
  const float* sc = s.scores.f32();
  const float* w = s.weight.f32();
  const int32_t* choice = s.choice.i32();
  const float* f = s.f.f32();
  const double aux = double(cfg_.moe.aux_loss) * double(ctx.loss_scale);
  const double zc = 2.0 * double(cfg_.moe.z_loss) * double(ctx.loss_scale);
  std::vector<double>& ds = ds_;
  std::vector<float>& p = key_;
  float* out = dl.f32() - r0 * E;  // dl holds rows [r0, r0 + R)
  for (int64_t n = r0; n < r0 + R; ++n) {
    const float* sn = sc + n * E;
    std::fill(ds.begin(), ds.end(), 0.0);
    // The combine weights: softmax w_j = p_e; sigmoid w_j = s_e / sum of the selected s.
    if (!sigmoid) {
      for (int64_t j = 0; j < K; ++j) ds[size_t(choice[n * K + j])] += dw[n * K + j];
    } else {
      double sum = 0, dot = 0;
      for (int64_t j = 0; j < K; ++j)
        sum += sn[choice[n * K + j]], dot += double(dw[n * K + j]) * w[n * K + j];
      for (int64_t j = 0; j < K; ++j)
        ds[size_t(choice[n * K + j])] += (double(dw[n * K + j]) - dot) / sum;
    }
    // The balancing loss: d/d(normalised score of e) = coefficient x loss_scale x f_e.
    if (aux > 0) {
      const float* fb = f + (n / T) * E;
      if (!sigmoid) {
        for (int64_t e = 0; e < E; ++e) ds[size_t(e)] += aux * fb[e];
      } else {
        double sum = 0, dot = 0;
        for (int64_t e = 0; e < E; ++e) sum += sn[e];
        for (int64_t e = 0; e < E; ++e) dot += aux * fb[e] * sn[e] / sum;
        for (int64_t e = 0; e < E; ++e) ds[size_t(e)] += (aux * fb[e] - dot) / sum;
      }
    }
    float* dn = out + n * E;
    if (!sigmoid) {
      double dot = 0;
      for (int64_t e = 0; e < E; ++e) dot += ds[size_t(e)] * sn[e];
      for (int64_t e = 0; e < E; ++e) dn[e] = float(sn[e] * (ds[size_t(e)] - dot));
    } else {
      for (int64_t e = 0; e < E; ++e) dn[e] = float(ds[size_t(e)] * sn[e] * (1.0 - sn[e]));
    }
    if (zc > 0) {
      const double z = softmax_row(s.logits.f32() + n * E, p.data(), E);
      for (int64_t e = 0; e < E; ++e) dn[e] += float(zc * z * p[size_t(e)]);
    }
  }
}

void Moe::backward(StepContext& ctx, const Tensor& x_rows, const Tensor& dy, const Tensor& dx) {
  const int64_t B = ctx.batch, T = cfg_.seq_local(), N = B * T, K = cfg_.moe.top_k;
  const int64_t C = cfg_.d_model, F = cfg_.moe.ffn, E = cfg_.moe.experts;
  const int64_t r0 = tp::first_row(ctx, N);  // dy and dx hold rows [r0, ...)
  const auto [q0, Q] = routed_rows(ctx, N);  // the rows this rank dispatched
  Saved& s = kept(ctx);
  const int32_t* row = s.row.i32();
  const float* w = s.weight.f32();
  const float* dyf = dy.f32() - r0 * C;  // indexed by the token's row among the N
  // d(expert output) = w dy; d(w) = dy . expert output (this rank's rows).
  const Tensor d_out = ctx.scratch.get(ScratchId::moe_d_out, {N * K, C});
  const Tensor dw = ctx.scratch.get(ScratchId::moe_d_weight, {N, K});
  for (int64_t n = q0; n < q0 + Q; ++n)
    for (int64_t j = 0; j < K; ++j) {
      const int32_t r = row[n * K + j];
      double dot = 0;
      if (r >= 0) {
        const float* o = s.out.f32() + int64_t(r) * C;
        float* d = d_out.f32() + int64_t(r) * C;
        for (int64_t c = 0; c < C; ++c) {
          d[c] = w[n * K + j] * dyf[n * C + c];
          dot += double(dyf[n * C + c]) * o[c];
        }
      }
      dw.f32()[n * K + j] = float(dot);
    }
  // The routed experts, each on its rows of the expert side: d(expert input) there, then
  // back to the packed side (moe_d_in).
  const int64_t El = int64_t(s.eoffset.size()) - 1, Rx = s.xe.shape.dims[0];
  const int64_t first_expert = (ctx.par.ep ? ctx.par.ep->rank() : 0) * El;
  const bool ep = ep_size(ctx) > 1;
  const Tensor d_in = ctx.scratch.get(ScratchId::moe_d_in, {N * K, C});
  const Tensor d_oe = ep ? ctx.scratch.get(ScratchId::moe_d_side_out, {Rx, C}) : d_out;
  const Tensor d_xe = ep ? ctx.scratch.get(ScratchId::moe_d_side_in, {Rx, C}) : d_in;
  to_experts(ctx, s, d_out, d_oe);
  const Tensor d_act = ctx.scratch.get(ScratchId::mlp_d_act, {Rx, F});
  // The hidden gradients as the dense Mlp's: one fused pass writes them (in 16 bits only the
  // GEMMs' operands, at the start of the fp32 buffers) and adds the bias gradients.
  const DType t = experts_.empty() ? DType::f32 : experts_.front().up.compute_dtype();
  const bool half = t != DType::f32;
  const Tensor d_up = hidden_grad(ctx, ScratchId::mlp_d_up, Rx, F, t);
  const Tensor d_gate = hidden_grad(ctx, ScratchId::mlp_d_gate, swiglu_ ? Rx : 1, F, t);
  const Tensor none;
  for (int64_t e = 0; e < El; ++e) {
    const int64_t first = s.eoffset[size_t(e)], n = s.eoffset[size_t(e) + 1] - first;
    if (n == 0) continue;
    const Expert& ex = experts_[size_t(first_expert + e - held_first_)];
    const Tensor up = rows(s.up, first, n, F), da = rows(d_act, first, n, F);
    const Tensor du = d_up.rows(first, n), dxe = rows(d_xe, first, n, C);
    ex.down.backward(ctx, rows(s.act, first, n, F), rows(d_oe, first, n, C), da);
    const Tensor xin = ex.up.operand(ctx, rows(s.xe, first, n, C));
    if (swiglu_) {
      const Tensor dg = d_gate.rows(first, n);
      kernels::swiglu_bias_backward(da, rows(s.gate, first, n, F), up, half ? none : dg,
                                    half ? none : du, half ? dg : none, half ? du : none,
                                    ex.gate.bias_grad(), ex.up.bias_grad(), n, F);
      ex.gate.backward_gemms(ctx, xin, dg, dxe);
      ex.up.backward_gemms(ctx, xin, du, dxe, /*accumulate_dx=*/true);
    } else {
      kernels::gelu_bias_backward(da, up, half ? none : du, half ? du : none, ex.up.bias_grad(),
                                  n, F);
      ex.up.backward_gemms(ctx, xin, du, dxe);
    }
  }
  from_experts(ctx, s, d_xe, d_in);
  // dx = shared experts' (reduced over tp) + router's + the routed experts' (each token's in
  // rank order), the last two on this rank's rows.
  const Tensor dl = ctx.scratch.get(ScratchId::moe_d_logits, {Q, E});
  router_grad(ctx, s, dw.f32(), dl, T, q0, Q);
  if (shared_) {
    const bool sp = tp::sequence_parallel(ctx);
    const Tensor x =
        tp::gather(ctx, x_rows, ctx.scratch.get(ScratchId::sp_gathered, {sp ? N * C : 1}));
    const Tensor dyg =
        tp::gather(ctx, dy, ctx.scratch.get(ScratchId::sp_gathered_grad, {sp ? N * C : 1}));
    shared_->backward(ctx, x, dyg, dx);
  }
  // Without sequence parallelism the router's and the routed experts' input gradients of this
  // rank's rows go into a zeroed N x C buffer, summed over tp, then added to every row of dx.
  const bool gather = Q != tp::rows(ctx, N);
  const Tensor own = gather ? ctx.scratch.get(ScratchId::moe_tp_rows, {N, C}) : dx;
  if (gather) kernels::fill(own, 0.0f, N * C);
  const int64_t o0 = gather ? q0 : 0;  // the first of this rank's rows in `own`
  router_.backward(ctx, x_rows.rows(gather ? q0 : 0, Q), dl, own.rows(o0, Q),
                   /*accumulate_dx=*/!gather && shared_ != nullptr);
  float* dxf = own.f32() - (gather ? 0 : r0) * C;
  for (int64_t n = q0; n < q0 + Q; ++n)
    for (int64_t j = 0; j < K; ++j)
      if (const int32_t r = row[n * K + j]; r >= 0) {
        const float* d = d_in.f32() + int64_t(r) * C;
        for (int64_t c = 0; c < C; ++c) dxf[n * C + c] += d[c];
      }
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
  std::vector<double>& v = sums_;  // sized once: E + 7
  std::copy(step_.load.begin(), step_.load.end(), v.begin());
  const double tail[7] = {step_.dropped,         step_.aux,    step_.z,
                          step_.sequences,       step_.tokens, step_.cross_bytes,
                          step_.cross_bytes_free};
  std::copy(tail, tail + 7, v.begin() + std::ptrdiff_t(E));
  if (dp.size() > 1) dp.all_reduce(v.data(), int64_t(v.size()));
  last_.load.assign(v.begin(), v.begin() + std::ptrdiff_t(E));
  last_.dropped = v[E], last_.aux = v[E + 1], last_.z = v[E + 2];
  last_.sequences = v[E + 3], last_.tokens = v[E + 4];
  last_.cross_bytes = v[E + 5], last_.cross_bytes_free = v[E + 6];
  last_.run_cross_bytes += last_.cross_bytes, last_.run_cross_bytes_free += last_.cross_bytes_free;
  std::fill(step_.load.begin(), step_.load.end(), 0.0);
  step_.dropped = step_.aux = step_.z = step_.sequences = step_.tokens = 0;
  step_.cross_bytes = step_.cross_bytes_free = 0;
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
