#include "model/output_head.hpp"

#include <algorithm>
#include <stdexcept>

#include "kernels/kernels.hpp"
#include "model/tensor_parallel.hpp"

namespace tessera {
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
  const Tensor mx = ctx.scratch.get(ScratchId::ce_max, {N});
  const Tensor sum = ctx.scratch.get(ScratchId::ce_sum_exp, {N}, DType::f64);
  const Tensor target = ctx.scratch.get(ScratchId::ce_target, {N});
  const Tensor tl = view_of(logits, {N, Vl}), tt = view_of(targets, {N});
  const Tensor tlosses = view_of(losses, {N});
  kernels::cross_entropy_local_max(tl, mx, N, Vl, valid);
  ctx.par.tp.all_reduce(mx.f32(), N, ReduceOp::max);
  kernels::cross_entropy_local_exp(tl, tt, mx, sum, target, N, Vl, valid, v0);
  ctx.par.tp.all_reduce(static_cast<double*>(sum.data), N);
  ctx.par.tp.all_reduce(target.f32(), N);
  kernels::cross_entropy_local_finish(tl, tt, sum, target, tlosses, N, Vl, valid, v0,
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
  float* xn = ctx.scratch.get(ScratchId::head_normed, {R, C}).f32();
  const Tensor logits = ctx.scratch.get(ScratchId::head_logits, {N, Vl});
  const Tensor losses = ctx.scratch.get(ScratchId::head_losses, {N});
  norm_.forward(x, xn, s.mean.f32(), s.rstd.f32(), R);
  const Tensor xf = view_of(
      tp::gather(ctx, xn, ctx.scratch.get(ScratchId::head_gathered, {R == N ? 1 : N * C}).f32(), N,
                 C),
      {N, C});
  kernels::matmul(xf, w_->value, logits, N, Vl, C, false, true);
  if (tp::size(ctx) == 1)
    kernels::cross_entropy_fused(logits, view_of(targets, {N}), losses, N, Vl, cfg_.vocab,
                                 ctx.loss_scale);
  else
    parallel_cross_entropy(ctx, logits.f32(), targets, losses.f32(), N);
  // Host bookkeeping: the losses are summed in order in double (the reported loss).
  double loss = 0;
  for (int64_t n = 0; n < N; ++n) loss += losses.f32()[n];
  if (ctx.training) {
    // logits now hold dlogits: dW += dlogits^T xn, dxn = dlogits W (summed over the ranks'
    // vocabulary blocks).
    kernels::matmul(logits, xf, w_->grad, Vl, C, N, true, false, 1.0f, 1.0f);
    const Tensor dxn = R == N && !tp::sequence_parallel(ctx)
                           ? s.dxn.view()
                           : ctx.scratch.get(ScratchId::tp_partial, {N, C});
    kernels::matmul(logits, w_->value, dxn, N, C, Vl, false, false);
    tp::reduce_grad(ctx, dxn.f32(), s.dxn.f32(), N, C);
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
  const Tensor xn = ctx.scratch.get(ScratchId::head_normed, {N, C});
  const Tensor full = ctx.scratch.get(ScratchId::head_logits, {N, Vp});
  // rstd in the first N, mean in the second N.
  float* rstd = ctx.scratch.get(ScratchId::head_losses, {2 * N}).f32();
  norm_.forward(x, xn.f32(), rstd + N, rstd, N);
  kernels::matmul(xn, w_->value, full, N, Vp, C, false, true);
  const Tensor tout = view_of(out, {N, V});
  for (int64_t n = 0; n < N; ++n) kernels::copy(full.rows(n, 1), tout.rows(n, 1), V);
}

}  // namespace tessera
