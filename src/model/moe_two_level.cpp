// The two-level expert dispatch (parallel.ep_dispatch = two_level; doc/moe.md, "Two-level
// dispatch"), DeepSeek-V3's and DeepEP's: the ep group is D nodes of L = ep / D ranks; ep rank
// g L + l is local rank l of node g. A token crosses to each node holding one of its kept
// experts once, over ep_cross, to the rank with its own local index there (the relay), which
// sends it on over ep_intra to the node's ranks running those experts; the node's weighted sum
// of the token's expert outputs is made by the relay and crosses back once. Backward goes the
// same way: the output gradient crosses once per node, the relay makes the experts' output
// gradients and the combine weights' gradients (as the flat dispatch's source does), and
// returns one summed input gradient per node.
//
// The expert side is the flat dispatch's row for row (for_each_chunk), so the experts' GEMMs
// and weight gradients are the same bits; only the combine adds a token's per-node sums
// instead of its experts' outputs one by one (doc/moe.md: within 1e-5, not bit-identical).
//
// The plans (which rows go where) are host loops over the routing's choices: a MoE run on a
// device is refused (train/device.cpp), as for the flat dispatch's counts.
#include <algorithm>

#include "kernels/kernels.hpp"
#include "model/moe.hpp"
#include "model/transfers.hpp"

namespace tessera {
namespace {

Tensor rows(const Tensor& t, int64_t first, int64_t count, int64_t cols) {
  return t.reshaped(Shape{t.numel() / cols, cols}).rows(first, count);
}

}  // namespace

void Moe::kept_nodes(const StepContext& ctx, Saved& s) {
  const int64_t N = ctx.batch * cfg_.seq_local(), E = cfg_.moe.experts, K = cfg_.moe.top_k;
  const int64_t C = cfg_.d_model, P = ep_size(ctx), D = cfg_.moe.nodes, L = P / D;
  const int64_t En = E / D;
  auto act = [&](Shape shape, DType t = DType::f32) {
    return Buffer(ctx.alloc, shape, t, Charge::activations);
  };
  s.nodes = D;
  s.table = act({N, D}, DType::i32);
  s.rrow = act({D * N, K}, DType::i32), s.rweight = act({D * N, K});
  s.np_out = act({D * N * K, C});  // (the kernels check K rows of room per row)
  s.send.assign(size_t(D), 0), s.recv.assign(size_t(D), 0);
  s.noff.assign(size_t(En) + 1, 0);
  for (auto* v : {&s.packed_count, &s.packed_displ, &s.side_count, &s.side_displ})
    v->assign(size_t(L), 0);
}

// The work space is this object's, while a saved set may be shared with the other blocks'
// (full recompute), so it is made apart from kept_nodes.
void Moe::node_workspace(const StepContext& ctx) {
  if (!src_rows_.empty()) return;
  const int64_t N = ctx.batch * cfg_.seq_local(), E = cfg_.moe.experts, K = cfg_.moe.top_k;
  const int64_t C = cfg_.d_model, D = cfg_.moe.nodes, En = E / D;
  // Rows a source sends: at most one per token and node; a relay receives at most N from each
  // node, and each brings at most min(K, E / D) choices on its node.
  auto comm = [&](Shape shape) { return Buffer(ctx.alloc, shape, DType::f32, Charge::comm); };
  const int64_t S = N * D;  // (the kernels check count x D rows of room)
  src_rows_ = comm({S, C}), relay_rows_ = comm({D * N, C}), np_rows_ = comm({D * N * K, C});
  src_dw_ = comm({S, K}), relay_dw_ = comm({D * N, K});
  src_meta_.assign(size_t(S * 2 * K), 0.0f), relay_meta_.assign(size_t(D * N * 2 * K), 0.0f);
  node_counts_.assign(size_t(E), 0.0f), cross_f_.assign(size_t(2 * D), 0.0f);
  next_.assign(size_t(En), 0);
  for (int i = 0; i < 2; ++i)
    cross_count_[i].assign(size_t(D), 0), cross_displ_[i].assign(size_t(D), 0);
}

int64_t Moe::cross_rows(StepContext& ctx, const Saved& s, bool back, const float* from, float* to,
                        int64_t W, StepTransfers* transfers) {
  Communicator& cross = *ctx.par.ep_cross;
  const size_t own = size_t(cross.rank());
  const std::vector<int64_t>& a = back ? s.recv : s.send;
  const std::vector<int64_t>& b = back ? s.send : s.recv;
  std::vector<int64_t>&ac = cross_count_[0], &ad = cross_displ_[0];
  std::vector<int64_t>&bc = cross_count_[1], &bd = cross_displ_[1];
  int64_t at_a = 0, at_b = 0;
  for (size_t g = 0; g < a.size(); ++g) {
    ac[g] = a[g] * W, bc[g] = b[g] * W;
    ad[g] = at_a, bd[g] = at_b;
    at_a += ac[g], at_b += bc[g];
  }
  // The own node's block crosses no node: copied here, not counted.
  std::copy(from + ad[own], from + ad[own] + ac[own], to + bd[own]);
  ac[own] = bc[own] = 0;
  const int64_t before = cross.stats().bytes;  // (counted when posted)
  if (transfers)
    transfers->add(cross.all_to_allv_async(from, ac, ad, to, bc, bd));
  else
    cross.all_to_allv(from, ac, ad, to, bc, bd);
  return cross.stats().bytes - before;
}

void Moe::nodes_post_dispatch(StepContext& ctx, Saved& s, const Tensor& x, int64_t q0, int64_t Q,
                              StepTransfers& transfers) {
  const int64_t E = cfg_.moe.experts, K = cfg_.moe.top_k, C = cfg_.d_model;
  const int64_t D = s.nodes, En = E / D;
  const int32_t* choice = s.choice.view().i32();
  const int32_t* row = s.row.view().i32();
  const float* weight = s.weight.view().f32();
  int32_t* table = s.table.view().i32();

  // The source: one row per token and node of its kept choices, [node][token] order.
  std::fill(s.send.begin(), s.send.end(), 0);
  for (int64_t i = 0; i < Q; ++i) {
    int32_t* t = table + i * D;
    std::fill(t, t + D, -1);
    for (int64_t j = 0; j < K; ++j) {
      const int64_t n = (q0 + i) * K + j;
      if (row[n] < 0) continue;
      const int64_t g = choice[n] / En;
      if (t[g] < 0) t[g] = 0, ++s.send[size_t(g)];  // once per node
    }
  }
  int64_t at = 0;
  std::vector<int64_t>& first = cross_displ_[1];  // each node's first row (scratch until sent)
  for (int64_t g = 0; g < D; ++g) first[size_t(g)] = at, at += s.send[size_t(g)];
  for (int64_t i = 0; i < Q; ++i)
    for (int64_t g = 0; g < D; ++g)
      if (table[i * D + g] >= 0) {
        const int64_t r = first[size_t(g)]++;
        table[i * D + g] = int32_t(r);
        // The routing slots that travel with the row: each choice's expert on that node (its
        // index there) and weight, or -1.
        float* m = src_meta_.data() + r * 2 * K;
        for (int64_t j = 0; j < K; ++j) {
          const int64_t n = (q0 + i) * K + j;
          const bool here = row[n] >= 0 && choice[n] / En == g;
          m[2 * j] = here ? float(choice[n] % En) : -1.0f;
          m[2 * j + 1] = here ? weight[n] : 0.0f;
        }
      }
  kernels::moe_gather(rows(x, q0, Q, C), s.table.view(), src_rows_.view(), 0, Q, D, C);

  // Rows per node both ways, then the rows (counted: the cross-node bytes) and their slots.
  Communicator& cross = *ctx.par.ep_cross;
  for (int64_t g = 0; g < D; ++g) cross_f_[size_t(g)] = float(s.send[size_t(g)]);
  cross.all_to_all(cross_f_.data(), cross_f_.data() + D, 1);
  s.received = 0;
  for (int64_t g = 0; g < D; ++g)
    s.recv[size_t(g)] = int64_t(cross_f_[size_t(D + g)]), s.received += s.recv[size_t(g)];
  const int64_t sent = cross_rows(ctx, s, false, src_rows_.f32(), relay_rows_.f32(), C, &transfers);
  if (tally_) step_.cross_bytes += double(sent);
  cross_rows(ctx, s, false, src_meta_.data(), relay_meta_.data(), 2 * K, &transfers);
}

void Moe::nodes_fan_out(StepContext& ctx, Saved& s, StepTransfers& transfers) {
  const int64_t E = cfg_.moe.experts, K = cfg_.moe.top_k, C = cfg_.d_model;
  const int64_t P = ep_size(ctx), D = s.nodes, L = P / D, En = E / D, El = E / P;
  transfers.finish();
  // The relay: the received rows' choices on this node, node-packed [node expert][row] (rows
  // in order: source node, then its tokens in order).
  const int64_t R = s.received;
  std::fill(node_counts_.begin(), node_counts_.end(), 0.0f);  // [node expert][source node]
  for (int64_t g = 0, i = 0; g < D; ++g)
    for (int64_t c = 0; c < s.recv[size_t(g)]; ++c, ++i)
      for (int64_t j = 0; j < K; ++j)
        if (const float slot = relay_meta_[size_t((i * K + j) * 2)]; slot >= 0)
          node_counts_[size_t(int64_t(slot) * D + g)] += 1.0f;
  s.noff[0] = 0;
  for (int64_t e = 0; e < En; ++e) {
    int64_t n = 0;
    for (int64_t g = 0; g < D; ++g) n += int64_t(node_counts_[size_t(e * D + g)]);
    next_[size_t(e)] = s.noff[size_t(e)];
    s.noff[size_t(e) + 1] = s.noff[size_t(e)] + n;
  }
  int32_t* rrow = s.rrow.view().i32();
  float* rweight = s.rweight.view().f32();
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < K; ++j) {
      const float slot = relay_meta_[size_t((i * K + j) * 2)];
      rrow[i * K + j] = slot >= 0 ? int32_t(next_[size_t(slot)]++) : -1;
      rweight[i * K + j] = slot >= 0 ? relay_meta_[size_t((i * K + j) * 2 + 1)] : 0.0f;
    }
  kernels::moe_gather(relay_rows_.view(), s.rrow.view(), np_rows_.view(), 0, R, K, C);

  // On over ep_intra: relay l sends local rank l' the rows of its experts; counts first,
  // [relay][local expert][source node].
  Communicator& intra = *ctx.par.ep_intra;
  intra.all_to_all(node_counts_.data(), s.counts.data(), El * D);
  s.eoffset[0] = 0;
  for (int64_t e = 0; e < El; ++e) {
    int64_t n = 0;
    for (int64_t l = 0; l < L; ++l)
      for (int64_t g = 0; g < D; ++g) n += int64_t(s.counts[size_t((l * El + e) * D + g)]);
    s.eoffset[size_t(e) + 1] = s.eoffset[size_t(e)] + n;
  }
  for (int64_t l = 0; l < L; ++l) {
    const size_t i = size_t(l);
    s.packed_displ[i] = s.noff[size_t(l * El)] * C;
    s.packed_count[i] = s.noff[size_t((l + 1) * El)] * C - s.packed_displ[i];
    s.side_count[i] = 0;
    for (int64_t k = 0; k < El * D; ++k)
      s.side_count[i] += int64_t(s.counts[size_t(l * El * D + k)]) * C;
    s.side_displ[i] = l == 0 ? 0 : s.side_displ[i - 1] + s.side_count[i - 1];
  }
  to_experts(ctx, s, np_rows_.view(), s.xe);
}

void Moe::nodes_post_combine(StepContext& ctx, Saved& s, StepTransfers& transfers) {
  const int64_t K = cfg_.moe.top_k, C = cfg_.d_model, R = s.received;
  from_experts(ctx, s, s.oe, s.np_out.view());
  // The relay's sum per received row: its choices on this node, weighted, in rank order.
  const Tensor part = rows(relay_rows_.view(), 0, R, C);
  kernels::fill(part, 0.0f, R * C);
  kernels::moe_combine(s.np_out.view(), s.rrow.view(), s.rweight.view(), part, 0, R, 0, K, C);
  cross_rows(ctx, s, true, relay_rows_.f32(), src_rows_.f32(), C, &transfers);
}

void Moe::nodes_backward_post(StepContext& ctx, Saved& s, const Tensor& dy_rows, int64_t Q,
                              StepTransfers& transfers) {
  kernels::moe_gather(dy_rows, s.table.view(), src_rows_.view(), 0, Q, s.nodes, cfg_.d_model);
  cross_rows(ctx, s, false, src_rows_.f32(), relay_rows_.f32(), cfg_.d_model, &transfers);
}

void Moe::nodes_backward_fan_out(StepContext& ctx, Saved& s, StepTransfers& transfers,
                                 const Tensor& d_oe, StepTransfers& weights) {
  const int64_t K = cfg_.moe.top_k, C = cfg_.d_model, R = s.received;
  transfers.finish();
  // The relay does what the flat dispatch's source does: w dy for each choice on its node, and
  // dy . (expert output) for the weights' gradient.
  kernels::moe_combine_backward(relay_rows_.view(), s.np_out.view(), s.rrow.view(),
                                s.rweight.view(), np_rows_.view(), relay_dw_.view(), 0, R, 0, K, C);
  to_experts(ctx, s, np_rows_.view(), d_oe);
  cross_rows(ctx, s, true, relay_dw_.f32(), src_dw_.f32(), K, &weights);
}

void Moe::nodes_backward_weights(Saved& s, int64_t q0, int64_t Q, const Tensor& dw,
                                 StepTransfers& weights) {
  const int64_t E = cfg_.moe.experts, K = cfg_.moe.top_k, D = s.nodes, En = E / D;
  weights.finish();
  // Each choice's weight gradient from the node that ran it (0 for a dropped choice).
  const int32_t* choice = s.choice.view().i32();
  const int32_t* row = s.row.view().i32();
  const int32_t* table = s.table.view().i32();
  const float* back = src_dw_.f32();
  float* d = dw.f32();
  for (int64_t i = 0; i < Q; ++i)
    for (int64_t j = 0; j < K; ++j) {
      const int64_t n = (q0 + i) * K + j;
      d[n] = row[n] < 0 ? 0.0f : back[table[i * D + choice[n] / En] * K + j];
    }
}

void Moe::nodes_backward_combine(StepContext& ctx, Saved& s, const Tensor& d_xe,
                                 StepTransfers& transfers) {
  const int64_t K = cfg_.moe.top_k, C = cfg_.d_model, R = s.received;
  from_experts(ctx, s, d_xe, np_rows_.view());
  const Tensor part = rows(relay_rows_.view(), 0, R, C);
  kernels::fill(part, 0.0f, R * C);
  kernels::moe_combine(np_rows_.view(), s.rrow.view(), Tensor{}, part, 0, R, 0, K, C);
  cross_rows(ctx, s, true, relay_rows_.f32(), src_rows_.f32(), C, &transfers);
}

}  // namespace tessera
