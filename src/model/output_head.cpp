#include "model/output_head.hpp"

#include <algorithm>
#include <stdexcept>

#include "kernels/kernels.hpp"
#include "model/tensor_parallel.hpp"

namespace tessera {
namespace {
enum ScratchId { kXn = 10, kLogits, kLosses, kPartial = 20, kFull = 24, kMax, kSumExp, kTarget };
}

OutputHead::OutputHead(ParamStore& store, const ModelConfig& cfg, Param* tied)
    : cfg_(cfg),
      norm_(store, "final_norm", cfg.d_model, cfg.arch == Arch::gpt2, cfg.norm_eps,
            cfg.tp.sequence_parallel && cfg.tp.size > 1) {
  // Vocabulary-parallel like the embedding (and the same rows when tied).
  w_ = tied ? tied
            : &store.add("head.weight", Shape{cfg.vocab_padded, cfg.d_model},
                         {ParamInit::normal, cfg.init_std, cfg.vocab}, true,
                         cfg.tp.size > 1 ? TpSplit{0, cfg.tp.size, cfg.tp.rank} : TpSplit{});
}

// Softmax cross-entropy over the vocabulary split between the tensor-parallel ranks: the row
// maximum, the sum of exponentials and the target's logit are all-reduced (3 x N numbers);
// no rank ever holds a whole row of logits.
void OutputHead::parallel_cross_entropy(StepContext& ctx, float* logits, const int32_t* targets,
                                        float* losses, int64_t N) {
  const int64_t Vl = cfg_.vocab_local(), v0 = cfg_.tp.rank * Vl;
  const int64_t valid = std::clamp<int64_t>(cfg_.vocab - v0, 0, Vl);
  float* mx = ctx.scratch.get(kMax, N);
  auto* sum = reinterpret_cast<double*>(ctx.scratch.get(kSumExp, 2 * N));
  float* target = ctx.scratch.get(kTarget, N);
  kernels::cross_entropy_local_max(logits, mx, N, Vl, valid);
  ctx.par.tp.all_reduce(mx, N, ReduceOp::max);
  kernels::cross_entropy_local_exp(logits, targets, mx, sum, target, N, Vl, valid, v0);
  ctx.par.tp.all_reduce(sum, N);
  ctx.par.tp.all_reduce(target, N);
  kernels::cross_entropy_local_finish(logits, targets, sum, target, losses, N, Vl, valid, v0,
                                      ctx.loss_scale);
}

double OutputHead::forward(StepContext& ctx, const float* x, const int32_t* targets) {
  const int64_t N = ctx.batch * cfg_.seq_len, C = cfg_.d_model, Vl = cfg_.vocab_local();
  const int64_t R = tp::rows(ctx, N);
  Saved& s = slots_.at(ctx.slot);
  if (s.rstd.numel() != R) {
    s.rstd = Buffer(ctx.alloc, Shape{R}, DType::f32, Charge::activations);
    if (norm_.layernorm()) s.mean = Buffer(ctx.alloc, Shape{R}, DType::f32, Charge::activations);
    s.dxn = Buffer(ctx.alloc, Shape{R, C}, DType::f32, Charge::activations);
  }
  s.x = x;
  float* xn = ctx.scratch.get(kXn, R * C);
  float* logits = ctx.scratch.get(kLogits, N * Vl);
  float* losses = ctx.scratch.get(kLosses, N);
  norm_.forward(x, xn, s.mean.f32(), s.rstd.f32(), R);
  const float* xf = tp::gather(ctx, xn, ctx.scratch.get(kFull, R == N ? 1 : N * C), N, C);
  kernels::matmul(xf, w_->value.f32(), logits, N, Vl, C, false, true);
  if (tp::size(ctx) == 1)
    kernels::cross_entropy_fused(logits, targets, losses, N, Vl, cfg_.vocab, ctx.loss_scale);
  else
    parallel_cross_entropy(ctx, logits, targets, losses, N);
  double loss = 0;
  for (int64_t n = 0; n < N; ++n) loss += losses[n];
  if (ctx.training) {
    // logits now hold dlogits: dW += dlogits^T xn, dxn = dlogits W (summed over the ranks'
    // vocabulary blocks).
    kernels::matmul(logits, xf, w_->grad.f32(), Vl, C, N, true, false, 1.0f, 1.0f);
    float* dxn = R == N && !tp::sequence_parallel(ctx) ? s.dxn.f32() : ctx.scratch.get(kPartial, N * C);
    kernels::matmul(logits, w_->value.f32(), dxn, N, C, Vl, false, false);
    tp::reduce_grad(ctx, dxn, s.dxn.f32(), N, C);
  }
  return loss;
}

void OutputHead::backward(StepContext& ctx, float* dx) {
  const int64_t R = tp::rows(ctx, ctx.batch * cfg_.seq_len);
  Saved& s = slots_.at(ctx.slot);
  norm_.backward(s.x, s.dxn.f32(), s.mean.f32(), s.rstd.f32(), dx, R);
}

void OutputHead::logits(StepContext& ctx, const float* x, float* out) {
  if (tp::size(ctx) > 1) throw std::logic_error("OutputHead::logits needs the whole vocabulary");
  const int64_t N = ctx.batch * cfg_.seq_len, C = cfg_.d_model, Vp = cfg_.vocab_padded;
  const int64_t V = cfg_.vocab;
  float* xn = ctx.scratch.get(kXn, N * C);
  float* full = ctx.scratch.get(kLogits, N * Vp);
  float* rstd = ctx.scratch.get(kLosses, 2 * N);
  norm_.forward(x, xn, rstd + N, rstd, N);
  kernels::matmul(xn, w_->value.f32(), full, N, Vp, C, false, true);
  for (int64_t n = 0; n < N; ++n) kernels::copy(full + n * Vp, out + n * V, V);
}

}  // namespace tessera
