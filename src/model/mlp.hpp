// The MLP sublayer: SwiGLU (llama) or GELU (gpt2), added onto the residual stream.
#pragma once

#include <string>

#include "model/config.hpp"
#include "model/linear.hpp"
#include "model/step_context.hpp"

namespace tessera {

class Mlp {
 public:
  Mlp(ParamStore& store, const std::string& name, const ModelConfig& cfg);

  // y[rows,C] += down(act(x)) for x[N,C] (kept by the caller until backward); rows as in
  // Attention::forward.
  void forward(StepContext& ctx, const Tensor& x, const Tensor& y);
  // dx[rows,C] overwritten for dy[N,C]; parameter gradients accumulated.
  void backward(StepContext& ctx, const Tensor& x, const Tensor& dy, const Tensor& dx);

 private:
  struct Saved {
    Buffer gate, up, act;  // gate is empty for gpt2 (up holds the GELU input)
  };
  const ModelConfig& cfg_;
  bool swiglu_;
  Linear gate_, up_, down_;
  Slots<Saved> slots_;
};

}  // namespace tessera
