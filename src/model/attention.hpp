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
  Attention(ParamStore& store, const std::string& name, const ModelConfig& cfg);

  // y[N,C] += o(attn(x)); x is kept by the caller until backward.
  void forward(StepContext& ctx, const float* x, float* y);
  // dx[N,C] = d(attn(x))/dx . dy (overwritten); parameter gradients accumulated.
  void backward(StepContext& ctx, const float* x, const float* dy, float* dx);

 private:
  struct Saved {
    Buffer q, k, v, att, lse;
  };
  const ModelConfig& cfg_;
  Linear q_, k_, v_, o_;
  Slots<Saved> slots_;
};

}  // namespace tessera
