#include "perf/activation_memory.hpp"

#include <algorithm>
#include <cmath>

#include "perf/memory.hpp"

namespace tessera {

double activation_element_bytes(const Layout& l) {
  return l.mixed() ? 2.0 : 4.0;
}

namespace {
// One layer's sizes on one rank: bytes per activation element, tp, tokens of a micro-batch's
// local sequence, model width, the query and the key/value widths per tp rank.
struct LayerDims {
  double a, t, T, C, q, k;
  bool gated;
};
LayerDims layer_dims(const ModelConfig& c, const Layout& l) {
  const double t = l.tp;
  return {activation_element_bytes(l),
          t,
          double(l.micro_batch) * double(c.seq_len) / l.cp,
          double(c.d_model),
          double(c.heads * c.head_dim) / t,
          double(std::max<int64_t>(1, c.kv_heads / l.tp) * c.head_dim),
          c.arch == Arch::llama};
}
}  // namespace

LayerActivations layer_activations(const Workload& w, const Layout& l, bool moe_layer) {
  const ModelConfig& c = w.cfg;
  const auto [a, t, T, C, q, k, gated] = layer_dims(c, l);
  double mlp_hidden = double(c.ffn_hidden);
  if (moe_layer)
    mlp_hidden = double(w.moe.top_k) * double(w.moe.expert_ffn ? w.moe.expert_ffn : c.ffn_hidden);
  LayerActivations r;
  r.replicated = a * T * C * 4 + (w.dropout ? T * C * 2 : 0);
  if (moe_layer) r.replicated += a * T * C * w.moe.top_k;  // tokens as dispatched to experts
  r.split = a * T * (q + 2 * k) + a * T * q + a * T * mlp_hidden / t * (gated ? 3 : 2);
  const double rows = double(l.micro_batch) * double(c.heads) / t * double(c.seq_len) / l.cp;
  if (w.flash_attention)
    r.split += 4 * rows;  // log-sum-exp per query row
  else
    r.scores = rows * double(c.seq_len) * (w.dropout ? 2 * a + 1 : a);
  r.input = a * T * C;
  if (l.seq_parallel) r.replicated /= t, r.input /= t;
  return r;
}

double saved_bytes_per_layer(const LayerActivations& a, Recompute r) {
  switch (r) {
    case Recompute::none:
      return a.total();
    case Recompute::selective:
      return a.replicated + a.split;
    case Recompute::full:
      return a.input;
  }
  return a.total();
}

double inflight_layer_equivalents(const Layout& l, int64_t layers, int64_t m) {
  const double L = double(layers), p = l.pp;
  if (l.pp == 1) return L;
  if (l.schedule == PipeSchedule::gpipe) return L / p * double(m);
  const double in_flight = std::min<double>(p, double(m));
  if (l.vpp == 1) return L / p * in_flight;
  return L / p * in_flight * (1 + (p - 1) / (p * l.vpp));
}

double weight_grad_pending_bytes_per_layer(const Workload& w, const Layout& l, bool moe_layer) {
  const ModelConfig& c = w.cfg;
  const auto [a, t, T, C, q, k, gated] = layer_dims(c, l);
  double F = double(c.ffn_hidden), rows = 1, router = 0;  // rows: of the second GEMM per token
  if (moe_layer) {
    F = double(w.moe.top_k) * double(w.moe.expert_ffn ? w.moe.expert_ffn : c.ffn_hidden);
    rows = double(w.moe.top_k);
    router = double(w.moe.experts);
  }
  return a * T * ((q + 2 * k) + C + F / t * (gated ? 2 : 1) + rows * C + router);
}

namespace {

// The MLP gradients' scratch (mlp_d_act, mlp_d_up, mlp_d_gate; words) of a scratch space whose
// backward passes visit `blocks` in this order: with a mixture of experts the dense blocks, the
// shared experts (N rows) and the routed experts (the expert side's Rx rows, sized for the
// worst case: every rank's N top_k rows) share it, so each buffer is the widest of its
// requests. Replayed block by block (in a MoE block the routed experts' buffers are taken
// first, then the shared experts run): a scratch buffer that grows is allocated before the old
// one is freed (model/step_context.cpp), so the largest buffer so replaced adds to the peak.
struct MlpGradScratch {
  double size = 0, replaced = 0;  // the buffers' final words; the largest buffer replaced
};
MlpGradScratch mlp_grad_scratch(const ModelConfig& c, double N,
                                const std::vector<int64_t>& blocks) {
  const double t = double(c.tp.size), F = double(c.ffn_hidden) / t;
  const bool gated = c.arch == Arch::llama;
  double size[3] = {0, 0, 0}, replaced = 0;  // d_act, d_up, d_gate
  auto need = [&](double act, double gate) {
    const double want[3] = {act, act, gate};
    for (int i = 0; i < 3; ++i)
      if (want[i] > size[i]) replaced = std::max(replaced, size[i]), size[i] = want[i];
  };
  for (const int64_t b : blocks) {
    if (!c.moe.enabled() || !c.moe.is_moe(b)) {
      need(N * F, gated ? N * F : 0);
      continue;
    }
    const double Fe = double(c.moe.ffn), Fs = double(c.moe.shared) * Fe / t;
    const double Rx = double(c.experts_held.size) * N * double(c.moe.top_k);
    need(Rx * Fe, gated ? Rx * Fe : Fe);  // gpt2 asks for an unused [1, Fe] d_gate
    if (c.moe.shared > 0) need(N * Fs, gated ? N * Fs : 0);
  }
  return {size[0] + size[1] + size[2], replaced};
}

}  // namespace

double tessera_workspace_bytes(const ModelConfig& c, int64_t micro_batch, bool half,
                               const std::vector<int64_t>& blocks, bool head) {
  const double t = double(c.tp.size), B = double(micro_batch), N = B * double(c.seq_local());
  const double C = double(c.d_model), D = double(c.head_dim);
  const bool sp = c.tp.sequence_parallel && c.tp.size > 1, split = c.tp.size > 1;
  const double R = sp ? N / t : N;
  const double Hq = double(c.heads) / t, Hkv = double(c.kv_heads) / t;
  const double F = double(c.ffn_hidden) / t, Vl = double(c.vocab_padded) / t;
  double f = 2 * N * Hq * D + 2 * N * Hkv * D;  // d_att, dq; dk, dv
  const double mats = c.arch == Arch::llama ? 3 : 2;
  if (!c.moe.enabled()) {
    f += N * F * mats;  // d_act, d_up (, d_gate)
  } else {
    // model/moe.cpp's backward: the MLP gradients' scratch is shared by the dense blocks, the
    // shared experts (N rows) and the routed experts (the expert side's Rx rows, sized for the
    // worst case: every rank's N top_k rows), so it is the widest of the three.
    const double K = double(c.moe.top_k), E = double(c.moe.experts);
    const double ep = double(c.experts_held.size), Rx = ep * N * K;
    std::vector<int64_t> order = blocks;
    for (int64_t b = c.layers - 1; blocks.empty() && b >= 0; --b) order.push_back(b);
    const MlpGradScratch mlp = mlp_grad_scratch(c, N, order);
    f += mlp.size + mlp.replaced;
    // The routing's tokens: whole sequences (every context-parallel rank routes them all).
    const double Nw = B * double(c.seq_len);
    // d_out, d_in; d_weight; d_logits of the N / t rows a tp rank dispatches (Moe::routed_rows).
    f += 2 * N * K * C + Nw * K + std::ceil(N / t) * E;
    // Without sequence parallelism a tp rank's routed rows go into a zeroed N x C buffer summed
    // over tp (moe_tp_rows).
    if (split && !sp) f += N * C;
    // The routing's work space (forward): f64 [2, Nw]; i32 [2 B E + E + 1 + Nw K]; f64 [B E + E +
    // 4].
    f += 4 * Nw + (2 * B * E + E + 1 + Nw * K) + 2 * (B * E + E + 4);
    if (c.cp.size > 1) f += 2 * Nw * C;  // the gathered rows, as gathered and in order
    if (ep > 1) f += 3 * Rx * C;         // the all-to-all's stage, d_oe, d_xe
  }
  f += 2 * R * C;  // d_norm, dh
  // The head computes its logits chunk by chunk (ModelConfig::head_rows): one chunk of H rows,
  // of all this rank's vocabulary or of one tile of Tv columns (ModelConfig::head_tile_cols).
  // A pipeline stage without the head has none of its buffers.
  const double H = head ? double(c.head_rows(int64_t(N))) : 0;
  const double Tv = c.head_tile_cols() > 0 ? double(c.head_tile_cols()) : Vl;
  const bool tiles = head && c.head_tile_cols() > 0;
  if (head) f += R * C + H * Tv + N;              // normed head input; a chunk's logits, losses
  f += 2 * R * C;                                 // the two gradient streams
  f += 2 * (sp ? N * C : 1);                      // gathered rows and gradients
  if (head) f += R == N ? 1 : N * C;              // the head's gathered rows
  if (split) f += N * C + R * C;                  // partial, sum
  if (split || tiles) f += H + 2 * H + H;         // a chunk's CE max, sum, target
  if (split && tiles) f += H;                     // and its local max
  // Context parallelism's buffers (model/context_parallel.cpp).
  if (c.cp.size > 1 && c.cp.kind == CpKind::ring)
    f += 5 * 2 * N * Hkv * D      // K/V blocks in hand and arriving, 2 dK/dV, own dK/dV
         + N / 2 * (Hq * D + Hq)  // a block's output (or dq) and lse
         + N * Hkv * D;           // a block's dk and dv
  if (c.cp.size > 1 && c.cp.kind == CpKind::ulysses)
    f += 4 * N * Hq * D + 4 * N * Hkv * D  // q, out, dout, dq; k, v, dk, dv by heads
         + 2 * N * std::max(Hq, Hkv) * D;  // the all-to-all's send and receive buffers
  const double tokens = B * double(c.seq_len + 1) + 2 * N;  // int32 tokens (whole), inputs, targets
  // 16-bit GEMM operands cast in scratch: the widest input (the head's normed input, the
  // attention output unless the attention core writes it in bf16: attention_io_bytes,
  // perf/memory.hpp) and the widest output gradient (of q/k/v, o: N rows; of a chunk of the
  // logits). The norms' outputs and a dense MLP's activation are kept in 16 bits (model/block.cpp,
  // mlp.cpp) and its hidden gradients written in 16 bits by its fused epilogue into the start of
  // their own fp32 buffers (d_up, d_gate above): none of them is cast. A mixture of experts casts
  // each expert's rows and activation (x) and output gradients (dy), its buffers taken for the
  // worst case, the expert side's Rx rows (Moe::run_experts).
  double x16 = N * std::max({C, attention_io_bytes(c) == 2 ? 0.0 : Hq * D});
  double dy16 = std::max(N * std::max({C, Hq * D, Hkv * D}), H * Tv);
  if (c.moe.enabled()) {
    const double Rx = double(c.experts_held.size) * N * double(c.moe.top_k);
    x16 = std::max(x16, Rx * std::max(C, double(c.moe.ffn)));
    dy16 = std::max(dy16, Rx * C);
  }
  return 4 * (f + tokens) + (half ? 2 * (x16 + dy16) : 0);
}

double tessera_pair_scratch_bytes(const ModelConfig& c, int64_t micro_batch, bool half,
                                  const std::vector<int64_t>& blocks,
                                  const std::vector<int64_t>& first_blocks) {
  if (blocks.empty()) return 0;
  const double t = double(c.tp.size), B = double(micro_batch), N = B * double(c.seq_local());
  const double C = double(c.d_model), D = double(c.head_dim);
  const bool sp = c.tp.sequence_parallel && c.tp.size > 1;
  const double R = sp ? N / t : N;
  const double Hq = double(c.heads) / t, Hkv = double(c.kv_heads) / t;
  double f = 2 * R * C;                   // the two gradient streams (grad_a, grad_b)
  f += 2 * R * C + 2 * (sp ? N * C : 1);  // d_norm, dh; gathered rows and gradients
  f += 2 * N * Hq * D + 2 * N * Hkv * D;  // d_att, dq; dk, dv
  // d_act, d_up, d_gate. A buffer replaced while it grows adds to the peak (the first scratch's
  // largest is in tessera_workspace_bytes): the larger of the two scratch spaces' transients,
  // each taken while the other space is whole (measured so, plan_validate_tessera).
  const MlpGradScratch mlp = mlp_grad_scratch(c, N, blocks);
  f += mlp.size;
  if (c.moe.enabled()) {
    std::vector<int64_t> order = first_blocks;
    for (int64_t b = c.layers - 1; first_blocks.empty() && b >= 0; --b) order.push_back(b);
    f += std::max(0.0, mlp.replaced - mlp_grad_scratch(c, N, order).replaced);
  }
  bool moe = false;
  for (const int64_t b : blocks) moe |= c.moe.enabled() && c.moe.is_moe(b);
  double x16 = N * (attention_io_bytes(c) == 2 ? 0.0 : Hq * D);  // the attention output
  double dy16 = N * std::max({C, Hq * D, Hkv * D});
  if (moe) {
    const double K = double(c.moe.top_k), E = double(c.moe.experts),
                 ep = double(c.experts_held.size);
    const double Rx = ep * N * K, Fe = double(c.moe.ffn);
    // d_out, d_in; d_weight; d_logits of the N / t rows a tp rank dispatches.
    f += 2 * N * K * C + B * double(c.seq_len) * K + std::ceil(N / t) * E;
    if (ep > 1) f += 3 * Rx * C;  // the all-to-all's stage, d_oe, d_xe
    x16 = std::max(x16, Rx * std::max(C, Fe));
    dy16 = std::max({dy16, Rx * C, std::ceil(N / t) * E});
  }
  return 4 * f + (half ? 2 * (x16 + dy16) : 0);
}

}  // namespace tessera
