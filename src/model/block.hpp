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

  // x[rows,C] (tp::rows) must stay valid until backward of the same slot (it is the
  // previous block's output). Returns this block's output [rows,C], owned by the block's slot.
  Tensor forward(StepContext& ctx, const Tensor& x);
  // dx[rows,C] overwritten with the gradient of the block's input, for dy[rows,C].
  void backward(StepContext& ctx, const Tensor& dy, const Tensor& dx);

 private:
  struct Saved {
    Tensor x;  // the input, owned by the caller
    Buffer n1, mean1, rstd1, h, n2, mean2, rstd2, out;
  };
  const ModelConfig& cfg_;
  Norm attn_norm_, mlp_norm_;
  Attention attn_;
  Mlp mlp_;
  Slots<Saved> slots_;
};

}  // namespace tessera
