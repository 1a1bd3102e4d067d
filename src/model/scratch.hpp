// Scratch memory for temporaries that do not outlive one layer call, shared by all layers. Every
// use has a name in ScratchId; uses that share a name share a buffer, so they must never be live
// at the same time (the tensor-parallel buffers are each used inside one layer call). Each buffer
// grows to the largest request once and is then reused, so steady-state steps allocate nothing;
// perf/activation_memory.cpp (tessera_workspace_bytes) counts these buffers and must follow any
// change here.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/tensor.hpp"

namespace tessera {

enum class ScratchId : int {
  // Attention backward: gradients of the attention output (before o), of q, k and v.
  attn_d_out,
  attn_dq,
  attn_dk,
  attn_dv,
  // MLP backward: gradients of the activation output, of the gate and of up.
  mlp_d_act,
  mlp_d_gate,
  mlp_d_up,
  // Mixture of experts backward (model/moe.cpp): the gradients of the packed expert outputs,
  // of the combine weights, of the packed expert inputs and of the router logits. The
  // experts' hidden gradients use the MLP's three buffers.
  moe_d_out,
  moe_d_weight,
  moe_d_in,
  moe_d_logits,
  // Mixture-of-experts routing (forward, kernels::moe_*): per token the logsumexp and score
  // sum (f64 [2, N]); the per-sequence and expert counts, the expert offsets and the
  // unrestricted choices (i32 [2 B E + E + 1 + N K]); the balancing terms and the statistics
  // (f64 [B E + E + 4]).
  moe_route_tokens,
  moe_route_counts,
  moe_route_sums,
  // Expert parallelism: the rows of an all-to-all as they arrive or leave ([source][expert]),
  // and the expert side's output and input gradients.
  moe_a2a,
  moe_d_side_out,
  moe_d_side_in,
  // Tensor parallelism without sequence parallelism: every row's routed output (forward) or
  // routed and router input gradient (backward), each rank's own rows filled, summed over tp.
  moe_tp_rows,
  // Context parallelism: the normed input as the cp ranks hold it ([cp rank][its rows]), and
  // in the sequences' order ([B, seq_len]), for the router (whole sequences on every cp rank).
  moe_cp_stage,
  moe_cp_rows,
  // Block backward: the gradient of a norm's output, and of the residual stream between the
  // sublayers.
  block_d_norm,
  block_dh,
  // Output head: the normed input, the logits (overwritten by their gradient), the per-token
  // losses (logits() keeps the norm's statistics there instead).
  head_normed,
  head_logits,
  head_losses,
  // Output head with sequence parallelism: its all-gathered normed input.
  head_gathered,
  // Vocabulary-parallel or tiled cross-entropy: row maxima, sums of exponentials (f64), target
  // logits; tiled and vocabulary-parallel: this rank's row maxima before their all-reduce.
  ce_max,
  ce_sum_exp,
  ce_target,
  ce_local_max,
  // Transformer backward: the two gradient streams, swapped block by block.
  grad_a,
  grad_b,
  // Tensor parallelism: a row-parallel output or column-parallel input gradient before the sum
  // over ranks, and the reduce-scattered sum.
  tp_partial,
  tp_sum,
  // Sequence parallelism: the all-gathered rows of a block's normed input, and of a gradient.
  sp_gathered,
  sp_gathered_grad,
  // Pipeline evaluation: a chunk input received from the previous stage.
  pipeline_input,
  // Mixed precision: a GEMM's input and output-gradient operands cast to the compute dtype
  // (Linear::operand).
  gemm_x,
  gemm_dy,
  // Context parallelism (model/context_parallel.cpp), inside one attention call. Ring: the
  // K/V block in hand and the one arriving, the dK/dV accumulators travelling with them (two,
  // alternating) and this rank's contribution, one block's partial output (or dq) and lse.
  cp_kv_a,
  cp_kv_b,
  cp_dkv_a,
  cp_dkv_b,
  cp_dkv_local,
  cp_part,
  cp_part_lse,
  cp_part_dk,
  cp_part_dv,
  // Ulysses: q, k, v, out, dout, dq, dk, dv sharded by heads, and the all-to-all buffers.
  cp_heads_q,
  cp_heads_k,
  cp_heads_v,
  cp_heads_out,
  cp_heads_dout,
  cp_heads_dq,
  cp_heads_dk,
  cp_heads_dv,
  cp_a2a_send,
  cp_a2a_recv,
  count
};

class Scratch {
 public:
  explicit Scratch(Allocator& alloc) : alloc_(alloc) {}
  // A tensor of `shape` and `dtype` in buffer `id`, in the allocator's space; its contents are
  // whatever the previous user of the buffer left.
  Tensor get(ScratchId id, Shape shape, DType dtype = DType::f32);
  // t for host code to read: t itself in host memory, else a copy of it in host staging
  // buffer `id` (allocated once from the allocator's host(); only a device run has these).
  Tensor readable(ScratchId id, const Tensor& t);

 private:
  Allocator& alloc_;
  std::vector<Buffer> buffers_, staging_;
};

}  // namespace tessera
