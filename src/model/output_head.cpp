#include "model/output_head.hpp"

#include "kernels/kernels.hpp"

namespace tessera {
namespace {
enum ScratchId { kXn = 10, kLogits, kLosses };
}

OutputHead::OutputHead(ParamStore& store, const ModelConfig& cfg, Param* tied)
    : cfg_(cfg), norm_(store, "final_norm", cfg.d_model, cfg.arch == Arch::gpt2, cfg.norm_eps) {
  w_ = tied ? tied
            : &store.add("head.weight", Shape{cfg.vocab_padded, cfg.d_model},
                         {ParamInit::normal, cfg.init_std, cfg.vocab}, true);
}

double OutputHead::forward(StepContext& ctx, const float* x, const int32_t* targets) {
  const int64_t N = ctx.batch * cfg_.seq_len, C = cfg_.d_model, Vp = cfg_.vocab_padded;
  Saved& s = slots_.at(ctx.slot);
  if (s.rstd.numel() != N) {
    s.rstd = Buffer(ctx.alloc, Shape{N}, DType::f32, Charge::activations);
    if (norm_.layernorm()) s.mean = Buffer(ctx.alloc, Shape{N}, DType::f32, Charge::activations);
    s.dxn = Buffer(ctx.alloc, Shape{N, C}, DType::f32, Charge::activations);
  }
  s.x = x;
  float* xn = ctx.scratch.get(kXn, N * C);
  float* logits = ctx.scratch.get(kLogits, N * Vp);
  float* losses = ctx.scratch.get(kLosses, N);
  norm_.forward(x, xn, s.mean.f32(), s.rstd.f32(), N);
  kernels::matmul(xn, w_->value.f32(), logits, N, Vp, C, false, true);
  kernels::cross_entropy_fused(logits, targets, losses, N, Vp, cfg_.vocab, ctx.loss_scale);
  double loss = 0;
  for (int64_t n = 0; n < N; ++n) loss += losses[n];
  if (ctx.training) {
    // logits now hold dlogits: dW += dlogits^T xn, dxn = dlogits W.
    kernels::matmul(logits, xn, w_->grad.f32(), Vp, C, N, true, false, 1.0f, 1.0f);
    kernels::matmul(logits, w_->value.f32(), s.dxn.f32(), N, C, Vp, false, false);
  }
  return loss;
}

void OutputHead::backward(StepContext& ctx, float* dx) {
  const int64_t N = ctx.batch * cfg_.seq_len;
  Saved& s = slots_.at(ctx.slot);
  norm_.backward(s.x, s.dxn.f32(), s.mean.f32(), s.rstd.f32(), dx, N);
}

void OutputHead::logits(StepContext& ctx, const float* x, float* out) {
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
