#include "model/mlp.hpp"

#include <cmath>

#include "kernels/kernels.hpp"
#include "model/tensor_parallel.hpp"
#include "model/transfers.hpp"

namespace tessera {
Mlp::Mlp(ParamStore& store, const std::string& name, const ModelConfig& cfg)
    : cfg_(cfg), swiglu_(cfg.arch == Arch::llama) {
  const int64_t C = cfg.d_model, F = cfg.ffn_hidden;
  const bool bias = cfg.has_bias();
  const float resid_std = cfg.init_std / std::sqrt(2.0f * float(cfg.layers));
  // The hidden width is split over tensor-parallel ranks: gate and up by output rows, down
  // by input columns.
  const int64_t t = cfg.tp.size, r = cfg.tp.rank;
  if (swiglu_) gate_ = Linear(store, name + ".gate", C, F, bias, cfg.init_std, Split::column, t, r);
  up_ = Linear(store, name + ".up", C, F, bias, cfg.init_std, Split::column, t, r);
  down_ = Linear(store, name + ".down", F, C, bias, resid_std, Split::row, t, r);
}

Mlp::Saved& Mlp::kept(const StepContext& ctx) {
  Saved& s = mode_ == Recompute::full ? *shared_ : slots_.at(ctx.slot);
  const int64_t N = ctx.batch * cfg_.seq_local(), F = cfg_.ffn_local();
  if (s.up.numel() != N * F) {
    if (swiglu_) s.gate = Buffer(ctx.alloc, Shape{N, F}, DType::f32, Charge::activations);
    s.up = Buffer(ctx.alloc, Shape{N, F}, DType::f32, Charge::activations);
  }
  return s;
}

Mlp::Saved& Mlp::activated(const StepContext& ctx) {
  Saved& s = mode_ == Recompute::none ? slots_.at(ctx.slot) : *shared_;
  const int64_t N = ctx.batch * cfg_.seq_local(), F = cfg_.ffn_local();
  // act feeds only down_'s GEMMs: kept in their operand dtype (16 bits in a 16-bit run).
  if (s.act.numel() != N * F)
    s.act = Buffer(ctx.alloc, Shape{N, F}, down_.compute_dtype(), Charge::activations);
  return s;
}

// One fused pass (kernels::gelu_bias_forward / swiglu_bias_forward): the biases added to the
// GEMMs' outputs when `bias` (they stay in `in` as the pre-activations) and the activation into
// out.act, in fp32 or, when down_ multiplies in 16 bits, rounded to its operand dtype (no fp32
// copy, no cast). Returns out.act, down_'s operand.
Tensor Mlp::activate(int64_t N, Saved& in, Saved& out, bool bias) const {
  const int64_t F = cfg_.ffn_local();
  const Tensor act = out.act.view(), none;
  const bool half = act.dtype != DType::f32;
  if (swiglu_)
    kernels::swiglu_bias_forward(in.gate.view(), in.up.view(), bias ? gate_.bias() : none,
                                 bias ? up_.bias() : none, half ? none : act, half ? act : none,
                                 N, F);
  else
    kernels::gelu_bias_forward(in.up.view(), bias ? up_.bias() : none, half ? none : act,
                               half ? act : none, N, F);
  return act;
}

void Mlp::forward(StepContext& ctx, const Tensor& x, const Tensor& y) {
  forward_hidden(ctx, x);
  forward_output(ctx, y);
}

void Mlp::forward_hidden(StepContext& ctx, const Tensor& x) {
  Saved& s = kept(ctx);
  // The activation's buffer is allocated here, as before the split.
  activated(ctx);
  const Tensor xc = up_.operand(ctx, x);  // cast once for both maps
  up_.forward_gemm(ctx, xc, s.up.view());  // the biases: in activate's pass
  if (swiglu_) gate_.forward_gemm(ctx, xc, s.gate.view());
}

void Mlp::forward_output(StepContext& ctx, const Tensor& y) {
  const int64_t N = ctx.batch * cfg_.seq_local(), C = cfg_.d_model;
  Saved& s = kept(ctx);
  Saved& a = activated(ctx);
  const Tensor act = activate(N, s, a, /*bias=*/true);
  ctx.poll_transfers();  // (the fused pass is the only compute before down)
  if (tp::size(ctx) == 1) return down_.forward(ctx, act, y, /*accumulate=*/true);
  const Tensor partial = ctx.scratch.get(ScratchId::tp_partial, {N, C});
  down_.forward(ctx, act, partial);
  tp::reduce_into(ctx, partial, y, ctx.scratch.get(ScratchId::tp_sum, {tp::rows(ctx, N), C}), true);
  down_.add_bias(y);
}

Tensor hidden_grad(StepContext& ctx, ScratchId id, int64_t rows, int64_t F, DType t) {
  const Tensor f32 = ctx.scratch.get(id, {rows, F});
  return t == DType::f32 ? f32 : ctx.scratch.get(id, {rows, F}, t);
}

void Mlp::backward(StepContext& ctx, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const int64_t N = ctx.batch * cfg_.seq_local(), F = cfg_.ffn_local(), C = cfg_.d_model;
  const Tensor dxp =
      tp::sequence_parallel(ctx) ? ctx.scratch.get(ScratchId::tp_partial, {N, C}) : dx;
  Saved& s = kept(ctx);
  Saved& a = activated(ctx);
  // Full recompute has just rebuilt everything (Block::backward); selective rebuilds act.
  const Tensor act = mode_ == Recompute::selective ? activate(N, s, a, /*bias=*/false) : a.act.view();
  const Tensor d_act = ctx.scratch.get(ScratchId::mlp_d_act, {N, F});
  down_.backward(ctx, act, dy, d_act);
  const Tensor xc = up_.operand(ctx, x);
  // One fused pass writes the hidden gradients, their bias gradients, and in 16 bits only the
  // GEMMs' operands (no fp32 copy and no cast).
  const DType t = up_.compute_dtype();
  const bool half = t != DType::f32;
  const Tensor d_up = hidden_grad(ctx, ScratchId::mlp_d_up, N, F, t);
  const Tensor none;
  if (swiglu_) {
    const Tensor d_gate = hidden_grad(ctx, ScratchId::mlp_d_gate, N, F, t);
    kernels::swiglu_bias_backward(d_act, s.gate.view(), s.up.view(), half ? none : d_gate,
                                  half ? none : d_up, half ? d_gate : none, half ? d_up : none,
                                  gate_.bias_grad(), up_.bias_grad(), N, F);
    gate_.backward_gemms(ctx, xc, d_gate, dxp);
    up_.backward_gemms(ctx, xc, d_up, dxp, /*accumulate_dx=*/true);
  } else {
    kernels::gelu_bias_backward(d_act, s.up.view(), half ? none : d_up, half ? d_up : none,
                                up_.bias_grad(), N, F);
    up_.backward_gemms(ctx, xc, d_up, dxp);
  }
  tp::reduce_grad(ctx, dxp, dx);  // the input gradient sums over the ranks' slices
}

}  // namespace tessera
