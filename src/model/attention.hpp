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

  // y[rows,C] += o(attn(x)) for x[N,C] (all tokens; kept by the caller until backward) and
  // the rows of the residual stream this rank holds (tp::rows).
  void forward(StepContext& ctx, const Tensor& x, const Tensor& y);
  // dx[rows,C] = d(attn(x))/dx . dy (overwritten) for dy[N,C]; parameter gradients
  // accumulated.
  void backward(StepContext& ctx, const Tensor& x, const Tensor& dy, const Tensor& dx);

 private:
  struct Saved {
    Buffer q, k, v, att, lse;
  };
  const ModelConfig& cfg_;
  Linear q_, k_, v_, o_;
  Slots<Saved> slots_;
};

}  // namespace tessera
