#include "model/output_head.hpp"

#include <algorithm>
#include <stdexcept>

#include "kernels/kernels.hpp"
#include "model/linear.hpp"
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
void OutputHead::parallel_cross_entropy(StepContext& ctx, const Tensor& logits,
                                        const Tensor& targets, const Tensor& losses,
                                        const Tensor& dlogits) {
  const int64_t Vl = cfg_.vocab_local(), v0 = cfg_.tp.rank * Vl;
  const int64_t N = rows_of(logits, Vl, "OutputHead logits");
  const int64_t valid = std::clamp<int64_t>(cfg_.vocab - v0, 0, Vl);
  const Tensor mx = ctx.scratch.get(ScratchId::ce_max, {N});
  const Tensor sum = ctx.scratch.get(ScratchId::ce_sum_exp, {N}, DType::f64);
  const Tensor target = ctx.scratch.get(ScratchId::ce_target, {N});
  kernels::cross_entropy_local_max(logits, mx, N, Vl, valid);
  ctx.par.tp.all_reduce(mx.slice(0, N), ReduceOp::max);
  kernels::cross_entropy_local_exp(logits, targets, mx, sum, target, N, Vl, valid, v0);
  ctx.par.tp.all_reduce(sum.slice(0, N));
  ctx.par.tp.all_reduce(target.slice(0, N));
  kernels::cross_entropy_local_finish(logits, targets, sum, target, losses, N, Vl, valid, v0,
                                      ctx.loss_scale, dlogits);
}

double OutputHead::forward(StepContext& ctx, const Tensor& x, const Tensor& targets) {
  const int64_t N = ctx.batch * cfg_.seq_local(), C = cfg_.d_model;
  const int64_t R = tp::rows(ctx, N);
  Saved& s = slots_.at(ctx.slot);
  if (s.rstd.numel() != R) {
    s.rstd = Buffer(ctx.alloc, Shape{R}, DType::f32, Charge::activations);
    if (norm_.layernorm()) s.mean = Buffer(ctx.alloc, Shape{R}, DType::f32, Charge::activations);
    s.dxn = Buffer(ctx.alloc, Shape{R, C}, DType::f32, Charge::activations);
  }
  s.x = x;
  const Tensor xn = ctx.scratch.get(ScratchId::head_normed, {R, C});
  const Tensor losses = ctx.scratch.get(ScratchId::head_losses, {N});
  norm_.forward(x, xn, s.mean.view(), s.rstd.view());
  const Tensor xf =
      tp::gather(ctx, xn, ctx.scratch.get(ScratchId::head_gathered, {R == N ? 1 : N * C}));
  // The head's GEMMs run in the compute dtype like every Linear (doc/precision.md); the logits
  // and the cross-entropy stay fp32.
  const Tensor w = w_->compute;
  const Tensor xc = gemm_operand(ctx, xf, w.dtype, ScratchId::gemm_x);
  const Tensor dxn = !ctx.training                                     ? Tensor{}
                     : R == N && !tp::sequence_parallel(ctx) ? s.dxn.view()
                                                             : ctx.scratch.get(ScratchId::tp_partial, {N, C});
  // The rows go through in chunks (ModelConfig::head_rows): a chunk's logits are computed,
  // turned into its losses and their gradient, and consumed by the two gradient GEMMs before
  // the next chunk's are computed in the same buffers, so the logits of a micro-batch are
  // never held whole. Each row's loss and gradient are those of the unchunked head; only the
  // weight gradient's sum over rows is taken chunk by chunk.
  const int64_t rows = cfg_.head_rows(N);
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    const int64_t n = std::min(rows, N - r0);
    head_chunk(ctx, xc.rows(r0, n), targets.slice(r0, n), losses.slice(r0, n),
               ctx.training ? dxn.rows(r0, n) : Tensor{}, n);
  }
  if (ctx.training) tp::reduce_grad(ctx, dxn, s.dxn.view());
  // Host bookkeeping: the losses are summed in order in double (the reported loss), read back
  // from device memory first.
  const float* host_losses = ctx.scratch.readable(ScratchId::head_losses, losses).f32();
  double loss = 0;
  for (int64_t n = 0; n < N; ++n) loss += host_losses[n];
  return loss;
}

void OutputHead::head_chunk(StepContext& ctx, const Tensor& xc, const Tensor& targets,
                            const Tensor& losses, const Tensor& dxn, int64_t n) {
  if (cfg_.head_tile_cols() > 0) return head_chunk_tiled(ctx, xc, targets, losses, dxn, n);
  const int64_t C = cfg_.d_model, Vl = cfg_.vocab_local();
  const Tensor w = w_->compute;
  // A 16-bit gradient of the logits, the operand of the two gradient GEMMs, is written by the
  // cross-entropy itself (no fp32 gradient, no cast pass). In training the 16-bit gradient's
  // buffer is free until the cross-entropy writes it, and the logits are free once it has:
  // each lends its memory to the GEMM after it, which may pack the weights there first, or
  // (with AMX, the input gradient) write its transpose there (kernels::matmul_packed_b: faster
  // on the head's shapes; no memory of its own).
  const Tensor logits = ctx.scratch.get(ScratchId::head_logits, {n, Vl});
  const Tensor half = ctx.training && w.dtype != DType::f32
                          ? ctx.scratch.get(ScratchId::gemm_dy, {n, Vl}, w.dtype)
                          : Tensor{};
  kernels::matmul_packed_b(xc, w, logits, n, Vl, C, false, true, half);
  if (tp::size(ctx) == 1)
    kernels::cross_entropy_fused(logits, targets, losses, n, Vl, cfg_.vocab, ctx.loss_scale,
                                 half);
  else
    parallel_cross_entropy(ctx, logits, targets, losses, half);
  if (!ctx.training) return;
  // dW += dlogits^T xn, dxn = dlogits W (summed over the ranks' vocabulary blocks after the
  // last chunk); in fp32 the logits now hold dlogits.
  const Tensor dlogits = half.data ? half : logits;
  kernels::matmul(dlogits, xc, w_->grad, Vl, C, n, true, false, 1.0f, 1.0f);
  kernels::matmul_packed_b(dlogits, w, dxn, n, C, Vl, false, false,
                           half.data ? logits : Tensor{});
}

// Vocabulary tiles (doc/performance.md, "Vocabulary tiles"): a tile's logits [n, T] stay in
// cache from the GEMM that makes them to the kernel that reads them, and are made twice (the
// statistics of a row need all its tiles before any gradient can be formed). Only this rank's
// real columns are tiled: a padding column's gradient is 0, so the GEMMs leave it out. Each
// row's loss and gradient are the softmax's; sums run in another order than the whole-row
// head's (the online log-sum-exp, the input gradient summed tile by tile).
void OutputHead::head_chunk_tiled(StepContext& ctx, const Tensor& xc, const Tensor& targets,
                                  const Tensor& losses, const Tensor& dxn, int64_t n) {
  const int64_t C = cfg_.d_model, Vl = cfg_.vocab_local(), T = cfg_.head_tile_cols();
  const int64_t v0 = cfg_.tp.rank * Vl, valid = std::clamp<int64_t>(cfg_.vocab - v0, 0, Vl);
  const Tensor w = w_->compute;
  const Tensor logits = ctx.scratch.get(ScratchId::head_logits, {n, T});
  const Tensor half = ctx.training && w.dtype != DType::f32
                          ? ctx.scratch.get(ScratchId::gemm_dy, {n, T}, w.dtype)
                          : Tensor{};
  const Tensor mx = ctx.scratch.get(ScratchId::ce_max, {n});
  const Tensor sum = ctx.scratch.get(ScratchId::ce_sum_exp, {n}, DType::f64);
  const Tensor target = ctx.scratch.get(ScratchId::ce_target, {n});
  // The logits of columns [c, c + t) of this rank's vocabulary, [n, t] at the start of `logits`.
  const auto tile = [&](int64_t c) {
    const int64_t t = std::min(T, valid - c);
    const Tensor out = logits.slice(0, n * t).reshaped({n, t});
    kernels::matmul(xc, w.rows(c, t), out, n, t, C, false, true);
    return std::pair{out, t};
  };
  if (valid == 0) kernels::cross_entropy_tile_stats(logits, targets, mx, sum, target, n, 0, v0, true);
  for (int64_t c = 0; c < valid; c += T) {
    const auto [l, t] = tile(c);
    kernels::cross_entropy_tile_stats(l, targets, mx, sum, target, n, t, v0 + c, c == 0);
  }
  if (tp::size(ctx) > 1) {
    const Tensor local = ctx.scratch.get(ScratchId::ce_local_max, {n});
    kernels::copy(mx, local, n);
    ctx.par.tp.all_reduce(mx.slice(0, n), ReduceOp::max);
    kernels::cross_entropy_rescale(sum, local, mx, n);
    ctx.par.tp.all_reduce(sum.slice(0, n));
    ctx.par.tp.all_reduce(target.slice(0, n));
  }
  kernels::cross_entropy_tile_loss(targets, mx, sum, target, losses, n);
  if (!ctx.training) return;
  // dW[c:c+t] += g^T xc and dxn (+)= g W[c:c+t] per tile, g the tile's gradient (16-bit in a
  // 16-bit run, else in place of its logits).
  if (valid == 0) kernels::fill(dxn, 0.0f, n * C);
  for (int64_t c = 0; c < valid; c += T) {
    const auto [l, t] = tile(c);
    const Tensor g = half.data ? half.slice(0, n * t).reshaped({n, t}) : l;
    kernels::cross_entropy_tile_grad(l, targets, mx, sum, n, t, v0 + c, ctx.loss_scale,
                                     half.data ? g : Tensor{});
    kernels::matmul(g, xc, w_->grad.rows(c, t), t, C, n, true, false, 1.0f, 1.0f);
    kernels::matmul(g, w.rows(c, t), dxn, n, C, t, false, false, 1.0f, c == 0 ? 0.0f : 1.0f);
  }
}

void OutputHead::backward(StepContext& ctx, const Tensor& dx) {
  Saved& s = slots_.at(ctx.slot);
  norm_.backward(s.x, s.dxn.view(), s.mean.view(), s.rstd.view(), dx);
}

void OutputHead::logits(StepContext& ctx, const Tensor& x, const Tensor& out) {
  if (tp::size(ctx) > 1) throw std::logic_error("OutputHead::logits needs the whole vocabulary");
  const int64_t N = ctx.batch * cfg_.seq_local(), C = cfg_.d_model, Vp = cfg_.vocab_padded;
  const int64_t V = cfg_.vocab;
  const Tensor xn = ctx.scratch.get(ScratchId::head_normed, {N, C});
  const Tensor full = ctx.scratch.get(ScratchId::head_logits, {N, Vp});
  // rstd in the first N, mean in the second N.
  const Tensor stats = ctx.scratch.get(ScratchId::head_losses, {2 * N});
  norm_.forward(x, xn, stats.slice(N, N), stats.slice(0, N));
  const Tensor w = w_->compute;
  kernels::matmul(gemm_operand(ctx, xn, w.dtype, ScratchId::gemm_x), w, full, N, Vp, C, false,
                  true);
  rows_of(out, V, "OutputHead::logits out");  // out.rows(n, 1) is row n of [N, V]
  kernels::copy_rows(full, Vp, out, V, N, V);
}

}  // namespace tessera
