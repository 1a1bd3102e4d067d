// Causal self-attention sublayer: q/k/v projections, RoPE (llama), blockwise attention,
// output projection added onto the residual stream.
#pragma once

#include <string>

#include "model/config.hpp"
#include "model/linear.hpp"
#include "model/step_context.hpp"

namespace tessera {

class Attention {
 public:
  // What backward reads: q, k, v after RoPE, the attention output and its log-sum-exp. q, k,
  // v and the output are bf16 in a bf16 run without context parallelism (resident_dtype), the
  // log-sum-exp fp32.
  struct Saved {
    Buffer q, k, v, att, lse;
  };

  Attention(ParamStore& store, const std::string& name, const ModelConfig& cfg);
  // Activations rebuilt in backward go to `shared` (one set for every block, since one block
  // is rebuilt at a time) instead of this layer's slots: with selective recompute the
  // attention core (att, lse), recomputed from the kept q, k, v; with full recompute
  // everything, rebuilt by the block's rerun of forward before backward.
  void share(Saved* shared, Recompute mode) { shared_ = shared, mode_ = mode; }

  // y[rows,C] += o(attn(x)) for x[N,C] (all tokens; kept by the caller until backward) and
  // the rows of the residual stream this rank holds (tp::rows).
  void forward(StepContext& ctx, const Tensor& x, const Tensor& y);
  // dx[rows,C] = d(attn(x))/dx . dy (overwritten) for dy[N,C]; parameter gradients
  // accumulated.
  void backward(StepContext& ctx, const Tensor& x, const Tensor& dy, const Tensor& dx);

 private:
  // Where this micro-batch's q, k, v and its attention output and lse live.
  Saved& kept(const StepContext& ctx);
  Saved& core(const StepContext& ctx);
  // att, lse = attention(q, k, v): the forward's call, rerun by selective recompute.
  void attend(StepContext& ctx, Saved& qkv, Saved& out);
  // The dtype of the attention core's products: bf16 when the weights' compute copy is bf16
  // (train.precision = bf16), else f32 (fp16 runs keep an fp32 core; doc/precision.md).
  DType core_dtype() const;
  // The dtype of the kept q, k, v and the attention output: bf16 with the bf16 core and no
  // context parallelism (the ring merges fp32 partial outputs and moves fp32 blocks; the
  // Ulysses all-to-alls are fp32), else f32. doc/precision.md.
  DType resident_dtype() const;
  // The softmax scale the attention kernel applies to its scores: 1/sqrt(D), or 1 with the
  // bf16 core, whose q is kept with the scale folded in (rounded once with it: scaling the
  // fp32 scores instead moved reference_llama_bf16's 50-step loss trajectory outside its band;
  // doc/precision.md). The model then scales dq.
  float kernel_scale() const;

  const ModelConfig& cfg_;
  const ParamStore& store_;
  Linear q_, k_, v_, o_;
  Slots<Saved> slots_;
  Saved* shared_ = nullptr;
  Recompute mode_ = Recompute::none;
};

}  // namespace tessera
