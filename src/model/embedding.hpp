// Token embedding (and gpt2's learned position embedding).
#pragma once

#include "model/config.hpp"
#include "model/param.hpp"
#include "model/step_context.hpp"

namespace tessera {

class Embedding {
 public:
  Embedding(ParamStore& store, const ModelConfig& cfg);

  // ids (i32, B*T of them) -> x[rows, C] (slot-owned; the rows of the residual stream this
  // rank holds, tp::rows). ids must stay valid until backward.
  Tensor forward(StepContext& ctx, const Tensor& ids);
  // Parameter gradients accumulated from dx[rows, C].
  void backward(StepContext& ctx, const Tensor& dx);
  Param& token_table() { return *tok_; }
  // Registers embed.tok.weight as the embedding does (a pipeline's last stage keeps its own
  // copy of the table for a tied head).
  static Param& add_token_table(ParamStore& store, const ModelConfig& cfg);

 private:
  // The position-table row of this rank's token n (ContextParallel's layout; restarted at each
  // document with document masking).
  int64_t position(const StepContext& ctx, int64_t n) const;
  struct Saved {
    Tensor ids;  // owned by the caller
    Buffer x;
  };
  const ModelConfig& cfg_;
  Param* tok_ = nullptr;
  Param* pos_ = nullptr;
  Slots<Saved> slots_;
};

}  // namespace tessera
