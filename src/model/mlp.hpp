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

  // y[N,C] += down(act(x)); x is kept by the caller until backward.
  void forward(StepContext& ctx, const float* x, float* y);
  // dx[N,C] overwritten; parameter gradients accumulated.
  void backward(StepContext& ctx, const float* x, const float* dy, float* dx);

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
