// Activation memory: what a layer saves for its backward, and how many micro-batches'
// worth a pipeline stage holds at once.
//
// Per layer and micro-batch (Korthikanti et al. 2022, "Reducing Activation Recomputation in
// Large Transformer Models", section 4, generalised to grouped-query attention, a gated MLP
// and optional dropout). With a bytes per element, T = b s / cp tokens on this rank, C the
// hidden size, q = heads x head_dim, k = kv_heads x head_dim (per TP rank at least one
// head), F the MLP hidden size, t the TP degree:
//   replicated over TP (divided by t with sequence parallelism):
//     a T C x 4            inputs of the two norms and of the QKV and first MLP GEMMs
//     T C x 2              two dropout masks (1 byte each), with dropout
//   split over TP:
//     a T (q + 2k) / t     Q, K, V
//     a T q / t            attention output (input of the output projection)
//     a T F x 2 / t        MLP: GeLU input and output (gated: 3, gate, up and product)
//   attention scores, split over TP (absent with FlashAttention, which keeps only the
//   log-sum-exp, 4 bytes per row):
//     b (heads/t) (s/cp) s x (a + 1 + a)   softmax output, dropout mask, dropout output
//                                          (without dropout only the softmax output, a)
// For GPT-3 shapes (q = k = C, F = 4C, a = 2, dropout) this is Korthikanti's
// s b h (34 + 5 a s / h) bytes; with TP, s b h (10 + 24/t + 5 a s/(h t)); with TP and SP,
// s b h (34/t + 5 a s/(h t)).
// Selective recompute drops the score terms; full recompute keeps only each layer's input
// (a T C, /t with SP) and rebuilds one layer's activations at a time during backward.
//
// A stage holds L/p layers' activations for each micro-batch in flight (Korthikanti 4.2.3):
// 1F1B: min(p, m) micro-batches on the first stage (p x L/p = L layers' worth); interleaved
// 1F1B with v chunks: L (1 + (p-1)/(p v)); GPipe: all m; no pipeline: one.
#pragma once

#include <cstdint>
#include <vector>

#include "perf/layout.hpp"

namespace tessera {

struct LayerActivations {
  double replicated = 0;  // bytes held on every TP rank (unless SP)
  double split = 0;       // bytes already divided over TP
  double scores = 0;      // attention scores/softmax (TP-split), zero with flash attention
  double input = 0;       // the layer's input alone (what full recompute keeps)
  double total() const { return replicated + split + scores; }
};
// Bytes per element of saved activations and of the GEMM operands for a layout's precision.
double activation_element_bytes(const Layout& l);
// Bytes one layer saves for one micro-batch on one rank, before recompute.
LayerActivations layer_activations(const Workload& w, const Layout& l, bool moe_layer);
// What stays saved per layer under the layout's recompute policy.
double saved_bytes_per_layer(const LayerActivations& a, Recompute r);

// Layers' worth of one micro-batch's activations the first pipeline stage holds at its peak
// (see above); m micro-batches per step.
double inflight_layer_equivalents(const Layout& l, int64_t layers, int64_t m);

// A split-backward schedule (zb-h1, zb-v, dualpipev) in a GPU framework: B computes the data
// gradients and leaves each weight-gradient GEMM for W, which reuses the saved activations (the
// GEMMs' inputs) and needs the output gradient dy of every GEMM, held from B to W. Per layer
// and micro-batch waiting for its W, on one rank (a, T, C, q, k, F and t as above; with
// experts F = top_k x expert width and E the experts):
//   a T (q + 2k) / t      dy of Q, K, V (column-parallel)
//   a T C                 dy of the attention's output projection (row-parallel: its output
//                         gradient is whole on every TP rank, gathered under SP)
//   a T F x 1 (2 gated) / t   dy of the MLP's first GEMM(s)
//   a T C (x top_k)       dy of the MLP's second GEMM, each routed row's with experts
//   a T E                 dy of the router's logits, with experts
// Biases take their gradients from the same dy; the column-parallel inputs SP gathers again
// are gathered at W, as the fused backward does, not held.
double weight_grad_pending_bytes_per_layer(const Workload& w, const Layout& l, bool moe_layer);

// tessera's own CPU implementation today (fp32, src/model/*): the activations are
// perf/memory.hpp's activation_bytes (exact, tested by activation_memory_tp and, for each
// recompute mode, activation_memory_recompute). The workspace
// is the shared scratch of temporaries, each slot sized to its largest request (gradients of
// Q/K/V and the attention output, of the MLP hidden tensors, of the norms and the residual
// stream, the logits; with tensor parallelism the partial sums, reduce-scatter targets,
// gathered rows and cross-entropy statistics) plus the token buffers of one micro-batch.
// c.tp gives the tensor-parallel split. half: train.precision bf16 / fp16 adds the GEMM
// operand buffers (ScratchId::gemm_x, gemm_dy; 2 bytes per element). blocks: the blocks this
// rank holds in the order its backward passes visit them (a pipeline stage's; empty: every
// block, last to first), which decide a mixture of experts' gradient scratch; head: the rank
// holds the output head (a pipeline stage may not).
double tessera_workspace_bytes(const ModelConfig& c, int64_t micro_batch, bool half = false,
                               const std::vector<int64_t>& blocks = {}, bool head = true);

// DualPipe's interleaved pairs (parallel/pp/paired_overlap.hpp): each pair's backward_input
// runs on a second Scratch (StepContext::over, train/trainer.cpp), which holds the buffers a
// backward requests, each at its largest over the pairs' passes: the two gradient streams,
// a block's norm and residual gradients, the attention's gradients, the MLP gradients (dense
// blocks, shared and routed experts, replayed as in the first scratch), a mixture of experts'
// packed, expert-side and router gradients and its all-to-all stage, and in 16 bits the GEMM
// operand casts (model/moe.cpp takes the experts' for the worst routing). blocks: the blocks
// the pairs' backward_input passes visit, in order (empty: no pairs, 0 bytes); first_blocks:
// those the other backward passes visit (tessera_workspace_bytes' blocks), whose scratch adds
// the largest MLP gradient buffer replaced while it grew: the peak adds the larger of the two
// spaces' such transients. The pairs interleave only without tp, cp and recompute, so none of
// those buffers are counted.
double tessera_pair_scratch_bytes(const ModelConfig& c, int64_t micro_batch, bool half,
                                  const std::vector<int64_t>& blocks,
                                  const std::vector<int64_t>& first_blocks);

}  // namespace tessera
