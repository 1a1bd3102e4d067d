// Context parallelism (doc/parallelism.md, "Context parallelism"): the attention of a
// sequence split over the cp ranks. Everything else in a block works token by token and
// needs nothing; attention needs every earlier token's keys and values.
//
// ring: this rank's tokens are two zigzag chunks of each sequence (ContextParallel::segments;
// laid out [chunk][sequence][token]). K/V blocks travel round the cp ring, one step per rank,
// each sent with a non-blocking send/recv posted before the attention of the block in hand;
// the partial results merge by the online-softmax rule (kernels::attention_merge). Backward
// passes the K/V blocks round again with their dK/dV accumulators one step behind, and
// each block's dK/dV comes home at the end. Per layer and micro-batch: forward cp - 1 K/V
// messages; backward cp - 1 K/V messages and cp dK/dV messages (each 2 x B x seq_len/cp x
// kv_heads_local x head_dim floats).
//
// ulysses: this rank holds one contiguous chunk of each sequence; all-to-alls turn q, k, v
// into whole sequences of heads/cp heads, attention runs locally, and an all-to-all brings
// the output back. Forward 4 all-to-alls per layer; backward 8 (q, k, v, out and dout to
// heads, dq, dk, dv back), since the head-sharded tensors are not kept.
#pragma once

#include "model/config.hpp"
#include "model/step_context.hpp"

namespace tessera::cp {

inline int64_t size(const StepContext& ctx) {
  return ctx.par.cp ? ctx.par.cp->size() : 1;
}

// att[N, Hq*D], lse = attention of this rank's queries q[N, Hq*D] over every key of their
// sequences (k, v[N, Hkv*D] on each cp rank); N = B x seq_local. lse holds B x Hq x seq_local
// floats (ring: [chunk][B][Hq][chunk length]; ulysses: [B][Hq/cp][seq_len]). compute: the
// kernels' product dtype (kernels::AttnShape::compute), the same in forward and backward.
void attention_forward(StepContext& ctx, const ModelConfig& cfg, const Tensor& q, const Tensor& k,
                       const Tensor& v, const Tensor& att, const Tensor& lse, DType compute);
// dq, dk, dv (overwritten) of this rank's tokens, from d_att and the forward's tensors.
void attention_backward(StepContext& ctx, const ModelConfig& cfg, const Tensor& d_att,
                        const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& att,
                        const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                        DType compute);

}  // namespace tessera::cp
