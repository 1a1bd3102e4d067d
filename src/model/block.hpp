// One transformer block: h = x + Attn(Norm(x)); y = h + Mlp(Norm(h)).
#pragma once

#include <string>

#include "model/attention.hpp"
#include <memory>

#include "model/mlp.hpp"
#include "model/moe.hpp"
#include "model/norm.hpp"

namespace tessera {

class Block {
 public:
  // What backward reads besides the sublayers' own: the input, the norms' outputs and
  // statistics, the residual stream between the sublayers; and the output.
  struct Saved {
    Tensor x;  // the input, owned by the caller
    Buffer n1, mean1, rstd1, h, n2, mean2, rstd2, out;
  };
  // The activations of the block being rebuilt (full recompute) or of the rebuilt pieces
  // (selective): one set for every block of the model, since one block's backward runs at a
  // time on a rank whatever the pipeline schedule (doc/recompute.md). Mixture-of-experts
  // blocks have their own block set (their second norm's output is fp32, the router's input)
  // and the experts' sets; the attention's is common to both kinds.
  struct Rebuilt {
    Saved block, moe_block;
    Attention::Saved attn;
    Mlp::Saved mlp, moe_shared;
    Moe::Saved moe;
  };

  // mode: none, selective, or full for a block that reruns its forward in backward; `shared`
  // holds what that rebuilds.
  // moe: the block's MLP is a mixture of experts (model.moe_layers).
  Block(ParamStore& store, const std::string& name, const ModelConfig& cfg,
        Recompute mode = Recompute::none, Rebuilt* shared = nullptr, bool moe = false);

  // x[rows,C] (tp::rows) must stay valid until backward of the same slot (it is the
  // previous block's output). Returns this block's output [rows,C], owned by the block's slot.
  Tensor forward(StepContext& ctx, const Tensor& x);
  // dx[rows,C] overwritten with the gradient of the block's input, for dy[rows,C].
  void backward(StepContext& ctx, const Tensor& dy, const Tensor& dx);
  // The block's mixture of experts, or null for a dense block.
  Moe* moe() const { return moe_.get(); }

 private:
  // The slot's saved state (x and out always live there), and where the rest lives.
  Saved& kept(const StepContext& ctx);
  Saved& inner(const StepContext& ctx);
  // The forward from x into s's buffers and `out` (also the rerun of full recompute: `rerun`).
  void run(StepContext& ctx, const Tensor& x, Saved& s, const Tensor& out, bool rerun = false);
  // Full recompute's rerun of forward into the shared set s, before backward.
  void rebuild(StepContext& ctx, const Tensor& x, Saved& s);

  const ModelConfig& cfg_;
  bool full_;
  Rebuilt* shared_;
  Norm attn_norm_, mlp_norm_;
  Attention attn_;
  std::unique_ptr<Mlp> mlp_;  // exactly one of mlp_ and moe_
  std::unique_ptr<Moe> moe_;
  Slots<Saved> slots_;
};

}  // namespace tessera
