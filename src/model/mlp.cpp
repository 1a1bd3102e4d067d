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

void Mlp::forward(StepContext& ctx, const Tensor& x, const Tensor& y) {
  const int64_t N = ctx.batch * cfg_.seq_len, F = cfg_.ffn_local(), C = cfg_.d_model;
  Saved& s = slots_.at(ctx.slot);
  if (s.up.numel() != N * F) {
    if (swiglu_) s.gate = Buffer(ctx.alloc, Shape{N, F}, DType::f32, Charge::activations);
    s.up = Buffer(ctx.alloc, Shape{N, F}, DType::f32, Charge::activations);
    s.act = Buffer(ctx.alloc, Shape{N, F}, DType::f32, Charge::activations);
  }
  const Tensor xc = up_.operand(ctx, x);  // cast once for both maps
  up_.forward(ctx, xc, s.up.view());
  if (swiglu_) {
    gate_.forward(ctx, xc, s.gate.view());
    kernels::swiglu_forward(s.gate.view(), s.up.view(), s.act.view(), N * F);
  } else {
    kernels::gelu_forward(s.up.view(), s.act.view(), N * F);
  }
  if (tp::size(ctx) == 1) return down_.forward(ctx, s.act.view(), y, /*accumulate=*/true);
  const Tensor partial = ctx.scratch.get(ScratchId::tp_partial, {N, C});
  down_.forward(ctx, s.act.view(), partial);
  tp::reduce_into(ctx, partial, y, ctx.scratch.get(ScratchId::tp_sum, {tp::rows(ctx, N), C}), true);
  down_.add_bias(y);
}

void Mlp::backward(StepContext& ctx, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const int64_t N = ctx.batch * cfg_.seq_len, F = cfg_.ffn_local(), C = cfg_.d_model;
  const Tensor dxp =
      tp::sequence_parallel(ctx) ? ctx.scratch.get(ScratchId::tp_partial, {N, C}) : dx;
  Saved& s = slots_.at(ctx.slot);
  const Tensor d_act = ctx.scratch.get(ScratchId::mlp_d_act, {N, F});
  const Tensor d_up = ctx.scratch.get(ScratchId::mlp_d_up, {N, F});
  down_.backward(ctx, s.act.view(), dy, d_act);
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
