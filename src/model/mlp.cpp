#include "model/mlp.hpp"

#include <cmath>

#include "kernels/kernels.hpp"
#include "model/tensor_parallel.hpp"

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
  if (s.act.numel() != N * F)
    s.act = Buffer(ctx.alloc, Shape{N, F}, DType::f32, Charge::activations);
  return s;
}

void Mlp::activate(int64_t n, Saved& in, Saved& out) const {
  if (swiglu_)
    kernels::swiglu_forward(in.gate.view(), in.up.view(), out.act.view(), n);
  else
    kernels::gelu_forward(in.up.view(), out.act.view(), n);
}

void Mlp::forward(StepContext& ctx, const Tensor& x, const Tensor& y) {
  const int64_t N = ctx.batch * cfg_.seq_local(), F = cfg_.ffn_local(), C = cfg_.d_model;
  Saved& s = kept(ctx);
  Saved& a = activated(ctx);
  const Tensor xc = up_.operand(ctx, x);  // cast once for both maps
  up_.forward(ctx, xc, s.up.view());
  if (swiglu_) gate_.forward(ctx, xc, s.gate.view());
  activate(N * F, s, a);
  if (tp::size(ctx) == 1) return down_.forward(ctx, a.act.view(), y, /*accumulate=*/true);
  const Tensor partial = ctx.scratch.get(ScratchId::tp_partial, {N, C});
  down_.forward(ctx, a.act.view(), partial);
  tp::reduce_into(ctx, partial, y, ctx.scratch.get(ScratchId::tp_sum, {tp::rows(ctx, N), C}), true);
  down_.add_bias(y);
}

void Mlp::backward(StepContext& ctx, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const int64_t N = ctx.batch * cfg_.seq_local(), F = cfg_.ffn_local(), C = cfg_.d_model;
  const Tensor dxp =
      tp::sequence_parallel(ctx) ? ctx.scratch.get(ScratchId::tp_partial, {N, C}) : dx;
  Saved& s = kept(ctx);
  Saved& a = activated(ctx);
  // Full recompute has just rebuilt everything (Block::backward); selective rebuilds act.
  if (mode_ == Recompute::selective) activate(N * F, s, a);
  const Tensor d_act = ctx.scratch.get(ScratchId::mlp_d_act, {N, F});
  const Tensor d_up = ctx.scratch.get(ScratchId::mlp_d_up, {N, F});
  down_.backward(ctx, a.act.view(), dy, d_act);
  const Tensor xc = up_.operand(ctx, x);
  if (swiglu_) {
    const Tensor d_gate = ctx.scratch.get(ScratchId::mlp_d_gate, {N, F});
    kernels::swiglu_backward(d_act, s.gate.view(), s.up.view(), d_gate, d_up, N * F);
    gate_.backward(ctx, xc, d_gate, dxp);
    up_.backward(ctx, xc, d_up, dxp, /*accumulate_dx=*/true);
  } else {
    kernels::gelu_backward(d_act, s.up.view(), d_up, N * F);
    up_.backward(ctx, xc, d_up, dxp);
  }
  tp::reduce_grad(ctx, dxp, dx);  // the input gradient sums over the ranks' slices
}

}  // namespace tessera
