// Final norm, output projection and cross-entropy. In training the loss gradient is taken in
// the same pass as the loss (the logits buffer becomes dlogits), and the projection's
// backward runs immediately, chunk of rows by chunk of rows (train.head_chunk_rows), so only
// dx of the final norm's output is kept per micro-batch, and the logits of one chunk at a
// time exist.
#pragma once

#include "model/config.hpp"
#include "model/norm.hpp"
#include "model/step_context.hpp"

namespace tessera {

class OutputHead {
 public:
  // tied: the output weight is the token embedding table.
  OutputHead(ParamStore& store, const ModelConfig& cfg, Param* tied);

  // x[rows, C] (tp::rows), targets (i32, N of them). Returns the sum over all N tokens of
  // -log p(target). In training also accumulates the output weight's gradient (scaled by
  // ctx.loss_scale) and saves what backward needs.
  double forward(StepContext& ctx, const Tensor& x, const Tensor& targets);
  // dx[rows,C] overwritten: the gradient reaching the last block's output.
  void backward(StepContext& ctx, const Tensor& dx);
  // out[N, V] = the logits of the unpadded vocabulary for x[N, C] (forward only, nothing
  // saved).
  void logits(StepContext& ctx, const Tensor& x, const Tensor& out);

 private:
  // logits[N, Vl] (this rank's columns), targets and losses[N]; dlogits: as
  // kernels::cross_entropy_fused's.
  void parallel_cross_entropy(StepContext& ctx, const Tensor& logits, const Tensor& targets,
                              const Tensor& losses, const Tensor& dlogits);
  // One chunk of n rows of the head (forward): xc[n, C] its 16-bit (or fp32) input, targets
  // and losses its n rows; in training also dW += and dxn[n, C] = (this rank's vocabulary
  // block's part).
  void head_chunk(StepContext& ctx, const Tensor& xc, const Tensor& targets,
                  const Tensor& losses, const Tensor& dxn, int64_t n);
  // The same over vocabulary tiles (ModelConfig::head_tile_cols): per tile of columns the
  // logits GEMM and the running statistics; then the losses; in training, per tile again the
  // logits GEMM, the tile's gradient and its two GEMMs. dxn is written whole here.
  void head_chunk_tiled(StepContext& ctx, const Tensor& xc, const Tensor& targets,
                        const Tensor& losses, const Tensor& dxn, int64_t n);
  struct Saved {
    Tensor x;  // the input, owned by the caller
    Buffer mean, rstd, dxn;
  };
  const ModelConfig& cfg_;
  Norm norm_;
  Param* w_ = nullptr;
  Slots<Saved> slots_;
};

}  // namespace tessera
