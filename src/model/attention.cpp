#include "model/attention.hpp"

#include <cmath>

#include "kernels/kernels.hpp"
#include "model/context_parallel.hpp"
#include "model/tensor_parallel.hpp"

namespace tessera {
namespace {

// RoPE at each token's global position: this rank's tokens are segments of [B, len] rows
// with contiguous positions (ContextParallel::segments); with document masking at each token's
// position in its document. With y (bf16) the rotated x goes there, rounded, in the same pass.
void rope_global(const StepContext& ctx, const ModelConfig& cfg, const Tensor& x, int64_t B,
                 int64_t H, bool inverse, const Tensor& y = {}) {
  if (ctx.docs.on())
    return kernels::rope_at(x, ctx.docs.position, B * cfg.seq_local(), H, cfg.head_dim,
                            cfg.rope_theta, inverse, y);
  int64_t row = 0;
  for (const ContextParallel::Segment& g : cfg.cp.segments(cfg.seq_len)) {
    kernels::rope(x.rows(row, B * g.len), B, g.len, H, cfg.head_dim, g.pos0, cfg.rope_theta,
                  inverse, y.data ? y.rows(row, B * g.len) : Tensor{});
    row += B * g.len;
  }
}

}  // namespace

Attention::Attention(ParamStore& store, const std::string& name, const ModelConfig& cfg)
    : cfg_(cfg), store_(store) {
  const int64_t C = cfg.d_model, qd = cfg.heads * cfg.head_dim, kvd = cfg.kv_heads * cfg.head_dim;
  const bool bias = cfg.has_bias();
  const float resid_std = cfg.init_std / std::sqrt(2.0f * float(cfg.layers));
  // Heads are split over tensor-parallel ranks: q, k, v by output rows, o by input columns.
  const int64_t t = cfg.tp.size, r = cfg.tp.rank;
  q_ = Linear(store, name + ".q", C, qd, bias, cfg.init_std, Split::column, t, r);
  k_ = Linear(store, name + ".k", C, kvd, bias, cfg.init_std, Split::column, t, r);
  v_ = Linear(store, name + ".v", C, kvd, bias, cfg.init_std, Split::column, t, r);
  o_ = Linear(store, name + ".o", qd, C, bias, resid_std, Split::row, t, r);
}

Attention::Saved& Attention::kept(const StepContext& ctx) {
  Saved& s = mode_ == Recompute::full ? *shared_ : slots_.at(ctx.slot);
  const int64_t N = ctx.batch * cfg_.seq_local(), D = cfg_.head_dim;
  const int64_t Hq = cfg_.heads_local(), Hkv = cfg_.kv_heads_local();
  if (s.q.numel() != N * Hq * D) {
    const DType t = resident_dtype();
    s.q = Buffer(ctx.alloc, Shape{N, Hq * D}, t, Charge::activations);
    s.k = Buffer(ctx.alloc, Shape{N, Hkv * D}, t, Charge::activations);
    s.v = Buffer(ctx.alloc, Shape{N, Hkv * D}, t, Charge::activations);
  }
  return s;
}

Attention::Saved& Attention::core(const StepContext& ctx) {
  Saved& s = mode_ == Recompute::none ? slots_.at(ctx.slot) : *shared_;
  const int64_t B = ctx.batch, T = cfg_.seq_local(), Hq = cfg_.heads_local();
  if (s.att.numel() != B * T * Hq * cfg_.head_dim) {
    s.att = Buffer(ctx.alloc, Shape{B * T, Hq * cfg_.head_dim}, resident_dtype(),
                   Charge::activations);
    s.lse = Buffer(ctx.alloc, Shape{B * Hq, T}, DType::f32, Charge::activations);
  }
  return s;
}

DType Attention::core_dtype() const {
  return store_.compute_dtype() == DType::bf16 ? DType::bf16 : DType::f32;
}

DType Attention::resident_dtype() const {
  return core_dtype() == DType::bf16 && cfg_.cp.size == 1 ? DType::bf16 : DType::f32;
}

float Attention::kernel_scale() const {
  return core_dtype() == DType::bf16 ? 1.0f : 1.0f / std::sqrt(float(cfg_.head_dim));
}

void Attention::attend(StepContext& ctx, Saved& qkv, Saved& out) {
  const int64_t B = ctx.batch, T = cfg_.seq_local(), D = cfg_.head_dim;
  const int64_t Hq = cfg_.heads_local(), Hkv = cfg_.kv_heads_local();
  if (cp::size(ctx) > 1)
    return cp::attention_forward(ctx, cfg_, qkv.q.view(), qkv.k.view(), qkv.v.view(),
                                 out.att.view(), out.lse.view(), core_dtype());
  const kernels::AttnShape shape{B, T, Hq, Hkv, D, kernel_scale(), 0, 0, 0, core_dtype()};
  kernels::attention_forward(qkv.q.view(), qkv.k.view(), qkv.v.view(), out.att.view(),
                             out.lse.view(), shape, ctx.docs.start);
}

void Attention::forward(StepContext& ctx, const Tensor& x, const Tensor& y) {
  const int64_t B = ctx.batch, T = cfg_.seq_local(), N = B * T;
  const int64_t Hq = cfg_.heads_local(), Hkv = cfg_.kv_heads_local(), C = cfg_.d_model;
  Saved& s = kept(ctx);
  Saved& c = core(ctx);
  const Tensor xc = q_.operand(ctx, x);  // cast once for the three maps
  const float fold = 1.0f / std::sqrt(float(cfg_.head_dim));  // the bf16 core's q scale
  if (resident_dtype() == DType::f32) {
    q_.forward(ctx, xc, s.q.view());
    k_.forward(ctx, xc, s.k.view());
    v_.forward(ctx, xc, s.v.view());
    if (cfg_.arch == Arch::llama) {
      rope_global(ctx, cfg_, s.q.view(), B, Hq, false);
      rope_global(ctx, cfg_, s.k.view(), B, Hkv, false);
    }
    // A bf16 core with fp32 q (context parallelism) reads q with the scale folded in.
    if (core_dtype() == DType::bf16) kernels::scale_inplace(s.q.view(), fold, s.q.numel());
  } else {
    // Each map's fp32 output (with its bias) goes to scratch that backward's dq uses (not live
    // in a forward), and is rounded once into the kept bf16 tensor: by RoPE's pass (llama), or
    // cast (gpt2, and v). q is kept with the softmax scale folded in (kernel_scale).
    const auto map = [&](const Linear& l, const Buffer& kept, int64_t H, bool rope) {
      const Tensor y = ctx.scratch.get(ScratchId::attn_dq, {N, H * cfg_.head_dim});
      l.forward(ctx, xc, y);
      if (&l == &q_) kernels::scale_inplace(y, fold, y.numel());
      if (rope)
        rope_global(ctx, cfg_, y, B, H, false, kept.view());
      else
        kernels::cast(y, kept.view(), y.numel());
    };
    const bool rope = cfg_.arch == Arch::llama;
    map(q_, s.q, Hq, rope);
    map(k_, s.k, Hkv, rope);
    map(v_, s.v, Hkv, false);
  }
  attend(ctx, s, c);
  if (tp::size(ctx) == 1) return o_.forward(ctx, c.att.view(), y, /*accumulate=*/true);
  const Tensor partial = ctx.scratch.get(ScratchId::tp_partial, {N, C});
  o_.forward(ctx, c.att.view(), partial);
  tp::reduce_into(ctx, partial, y, ctx.scratch.get(ScratchId::tp_sum, {tp::rows(ctx, N), C}), true);
  o_.add_bias(y);
}

void Attention::backward(StepContext& ctx, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const int64_t B = ctx.batch, T = cfg_.seq_local(), N = B * T, D = cfg_.head_dim;
  const int64_t Hq = cfg_.heads_local(), Hkv = cfg_.kv_heads_local(), C = cfg_.d_model;
  Saved& s = kept(ctx);
  Saved& c = core(ctx);
  // Full recompute has just rebuilt everything (Block::backward); selective rebuilds the core.
  if (mode_ == Recompute::selective) attend(ctx, s, c);
  const Tensor d_att = ctx.scratch.get(ScratchId::attn_d_out, {N, Hq * D});
  const Tensor dq = ctx.scratch.get(ScratchId::attn_dq, {N, Hq * D});
  const Tensor dk = ctx.scratch.get(ScratchId::attn_dk, {N, Hkv * D});
  const Tensor dv = ctx.scratch.get(ScratchId::attn_dv, {N, Hkv * D});

  o_.backward(ctx, c.att.view(), dy, d_att);
  if (cp::size(ctx) > 1) {
    cp::attention_backward(ctx, cfg_, d_att, s.q.view(), s.k.view(), s.v.view(), c.att.view(),
                           c.lse.view(), dq, dk, dv, core_dtype());
  } else {
    const kernels::AttnShape shape{B, T, Hq, Hkv, D, kernel_scale(), 0, 0, 0, core_dtype()};
    kernels::attention_backward(d_att, s.q.view(), s.k.view(), s.v.view(), c.att.view(),
                                c.lse.view(), dq, dk, dv, shape, ctx.docs.start);
  }
  // The gradient of the unscaled q (the kernel's is of the q it read, scaled: kernel_scale).
  if (core_dtype() == DType::bf16)
    kernels::scale_inplace(dq, 1.0f / std::sqrt(float(D)), dq.numel());
  if (cfg_.arch == Arch::llama) {
    rope_global(ctx, cfg_, dq, B, Hq, true);
    rope_global(ctx, cfg_, dk, B, Hkv, true);
  }
  // The input gradient sums over the ranks' heads.
  const Tensor dxp =
      tp::sequence_parallel(ctx) ? ctx.scratch.get(ScratchId::tp_partial, {N, C}) : dx;
  const Tensor xc = q_.operand(ctx, x);
  q_.backward(ctx, xc, dq, dxp);
  k_.backward(ctx, xc, dk, dxp, /*accumulate_dx=*/true);
  v_.backward(ctx, xc, dv, dxp, /*accumulate_dx=*/true);
  tp::reduce_grad(ctx, dxp, dx);
}

}  // namespace tessera
