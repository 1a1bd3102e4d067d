// Compute time of one transformer layer on one accelerator, for one micro-batch.
//
// GEMMs: a GEMM of shape (M x K) . (K x N) does 2MNK FLOPs and takes
//   max(2MNK / (peak x eff(d)),  bytes / memory_bw),   eff(d) = gemm_efficiency x d / (d + d_half)
// with d = min(M, N, K) (small dimensions fill fewer tiles: the efficiency falls as the
// GEMM gets thin, as measured GEMM rates do) and bytes = (MK + KN + MN) x element size (a
// GEMM whose operands dominate is bound by memory: the batched attention-score GEMMs of a
// materialised attention). The backward of a linear layer is two GEMMs, data gradient
// (M x N).(N x K) and weight gradient (K x M).(M x N), each timed by its own shape.
//
// Element-wise work (norms, activation functions, softmax, dropout, residual adds, rotary
// embedding) is bound by memory: its forward moves twice the bytes the layer saves for
// backward (each saved tensor is written once and read once by the next op), its backward
// twice that (Korthikanti et al. 2022 count the saved bytes; see activation_memory.hpp).
//
// Attention core: with FlashAttention the two GEMMs QK^T and PV run fused per tile; it is
// timed as one GEMM of 4 b s^2 d_head FLOPs per head (times attention_work_fraction under a
// causal mask) at the efficiency of a GEMM with inner
// dimension 2 d_head (two back-to-back products on the same tile), and its backward as 2.5
// times the forward (five products instead of two: the score tile is recomputed). Without
// FlashAttention the two products are batched GEMMs timed by shape (so by memory when
// d_head is small) and the scores pass through memory in the element-wise term.
#pragma once

#include "perf/activation_memory.hpp"  // activation_element_bytes
#include "perf/cluster.hpp"
#include "perf/layout.hpp"

namespace tessera {

double gemm_efficiency(const Cluster& c, double m, double n, double k);
// Seconds for `batch` independent (m x k).(k x n) products at the given peak.
double gemm_seconds(const Cluster& c, double peak, double m, double n, double k, double batch = 1,
                    double element_bytes = 2);
// Forward + data-gradient + weight-gradient seconds of a linear layer y(MxN) = x(MxK) W(KxN).
struct LinearSeconds {
  double forward = 0, backward = 0;
};
LinearSeconds linear_seconds(const Cluster& c, double peak, double m, double n, double k,
                             double element_bytes);

// One layer, one micro-batch, one accelerator (its TP/CP/EP share of the layer).
struct LayerCompute {
  double gemm_fwd = 0, gemm_bwd = 0;  // linear layers (QKV, output, MLP or experts)
  double attn_fwd = 0, attn_bwd = 0;  // attention core (scores and weighted sum)
  double elementwise_fwd = 0, elementwise_bwd = 0;
  double score_elementwise_fwd = 0;  // part of elementwise_fwd on the scores
  double flops_fwd = 0;              // model FLOPs of the forward (x3 for fwd+bwd)
  double attn_flops_fwd = 0;         // of which attention core
  double forward() const { return gemm_fwd + attn_fwd + elementwise_fwd; }
  double backward() const { return gemm_bwd + attn_bwd + elementwise_bwd; }
  // Extra forward work recompute adds (full: the whole forward; selective: the attention
  // core and its element-wise work, Korthikanti et al. 2022 section 5).
  double recompute(Recompute r) const;
  double recompute_flops(Recompute r) const;
};
LayerCompute layer_compute(const Workload& w, const Layout& l, const Cluster& c, bool moe_layer);

// The output head (final norm, logits GEMM, softmax cross-entropy) and the embedding lookup.
struct HeadCompute {
  double forward = 0, backward = 0, flops_fwd = 0;
};
HeadCompute head_compute(const Workload& w, const Layout& l, const Cluster& c);

// Model FLOPs per trained token (MFU numerator): perf/flops.hpp's count for dense models;
// a MoE layer counts top_k experts' MLPs and its router instead of the dense MLP.
// Attention's T x T products count in full (AttentionFlops::full, the convention of
// Megatron-LM's papers, PaLM's MFU and tessera's runs) or only the causal half
// (AttentionFlops::causal, 6 L s (heads x head_dim) instead of 12).
enum class AttentionFlops { full, causal };
double workload_flops_per_token(const Workload& w, AttentionFlops conv = AttentionFlops::full);
// Fraction of the T x T attention work a kernel does: with causal FlashAttention the tiles
// on and below the diagonal, (1 + 1/n)/2 for n = ceil(s / 128) tiles per row; 1 otherwise.
double attention_work_fraction(const Workload& w);
// Parameters of the workload's model (ModelConfig::param_count, with MoE layers' experts
// and routers in place of the dense MLPs).
double workload_params(const Workload& w);

}  // namespace tessera
