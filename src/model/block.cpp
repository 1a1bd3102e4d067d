#include "model/block.hpp"

#include "kernels/kernels.hpp"
#include "model/tensor_parallel.hpp"

namespace tessera {
Block::Block(ParamStore& store, const std::string& name, const ModelConfig& cfg)
    : cfg_(cfg),
      attn_norm_(store, name + ".attn_norm", cfg.d_model, cfg.arch == Arch::gpt2, cfg.norm_eps,
                 cfg.tp.sequence_parallel && cfg.tp.size > 1),
      mlp_norm_(store, name + ".mlp_norm", cfg.d_model, cfg.arch == Arch::gpt2, cfg.norm_eps,
                cfg.tp.sequence_parallel && cfg.tp.size > 1),
      attn_(store, name + ".attn", cfg),
      mlp_(store, name + ".mlp", cfg) {}

// With sequence parallelism the norms and residual adds run on this rank's R = N/t rows; the
// normed input is all-gathered before each sublayer (and again in backward: only the rows
// are kept) and each sublayer reduce-scatters its output. Without it R = N.
const float* Block::forward(StepContext& ctx, const float* x) {
  const int64_t N = ctx.batch * cfg_.seq_len, C = cfg_.d_model, R = tp::rows(ctx, N);
  Saved& s = slots_.at(ctx.slot);
  if (s.out.numel() != R * C) {
    auto act = [&](int64_t n) { return Buffer(ctx.alloc, Shape{n}, DType::f32, Charge::activations); };
    s.n1 = act(R * C), s.h = act(R * C), s.n2 = act(R * C), s.out = act(R * C);
    s.rstd1 = act(R), s.rstd2 = act(R);
    if (attn_norm_.layernorm()) s.mean1 = act(R), s.mean2 = act(R);
  }
  float* full =
      ctx.scratch.get(ScratchId::sp_gathered, {tp::sequence_parallel(ctx) ? N * C : 1}).f32();
  s.x = x;
  attn_norm_.forward(x, s.n1.f32(), s.mean1.f32(), s.rstd1.f32(), R);
  kernels::copy(view_of(x, {R, C}), s.h.view(), R * C);
  attn_.forward(ctx, tp::gather(ctx, s.n1.f32(), full, N, C), s.h.f32());
  mlp_norm_.forward(s.h.f32(), s.n2.f32(), s.mean2.f32(), s.rstd2.f32(), R);
  kernels::copy(s.h.view(), s.out.view(), R * C);
  mlp_.forward(ctx, tp::gather(ctx, s.n2.f32(), full, N, C), s.out.f32());
  return s.out.f32();
}

void Block::backward(StepContext& ctx, const float* dy, float* dx) {
  const int64_t N = ctx.batch * cfg_.seq_len, C = cfg_.d_model, R = tp::rows(ctx, N);
  Saved& s = slots_.at(ctx.slot);
  float* d_norm = ctx.scratch.get(ScratchId::block_d_norm, {R, C}).f32();
  const Tensor dh = ctx.scratch.get(ScratchId::block_dh, {R, C});
  const bool sp = tp::sequence_parallel(ctx);
  float* full = ctx.scratch.get(ScratchId::sp_gathered, {sp ? N * C : 1}).f32();
  float* dfull = ctx.scratch.get(ScratchId::sp_gathered_grad, {sp ? N * C : 1}).f32();
  // y = h + mlp(n2(h))
  mlp_.backward(ctx, tp::gather(ctx, s.n2.f32(), full, N, C), tp::gather(ctx, dy, dfull, N, C),
                d_norm);
  mlp_norm_.backward(s.h.f32(), d_norm, s.mean2.f32(), s.rstd2.f32(), dh.f32(), R);
  kernels::add_inplace(dh, view_of(dy, {R, C}), R * C);
  // h = x + attn(n1(x))
  attn_.backward(ctx, tp::gather(ctx, s.n1.f32(), full, N, C),
                 tp::gather(ctx, dh.f32(), dfull, N, C), d_norm);
  attn_norm_.backward(s.x, d_norm, s.mean1.f32(), s.rstd1.f32(), dx, R);
  kernels::add_inplace(view_of(dx, {R, C}), dh, R * C);
}

}  // namespace tessera
