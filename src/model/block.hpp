// One transformer block: h = x + Attn(Norm(x)); y = h + Mlp(Norm(h)).
#pragma once

#include <string>

#include "model/attention.hpp"
#include "model/mlp.hpp"
#include "model/norm.hpp"

namespace tessera {

class Block {
 public:
  Block(ParamStore& store, const std::string& name, const ModelConfig& cfg);

  // x must stay valid until backward of the same slot (it is the previous block's output).
  // Returns this block's output, owned by the block's slot.
  const float* forward(StepContext& ctx, const float* x);
  // dx[N,C] overwritten with the gradient of the block's input.
  void backward(StepContext& ctx, const float* dy, float* dx);

 private:
  struct Saved {
    const float* x = nullptr;
    Buffer n1, mean1, rstd1, h, n2, mean2, rstd2, out;
  };
  const ModelConfig& cfg_;
  Norm attn_norm_, mlp_norm_;
  Attention attn_;
  Mlp mlp_;
  Slots<Saved> slots_;
};

}  // namespace tessera
