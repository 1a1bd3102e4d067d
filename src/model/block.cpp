#include "model/block.hpp"

#include "kernels/kernels.hpp"

namespace tessera {
namespace {
enum ScratchId { kDNorm = 8, kDh };
}

Block::Block(ParamStore& store, const std::string& name, const ModelConfig& cfg)
    : cfg_(cfg),
      attn_norm_(store, name + ".attn_norm", cfg.d_model, cfg.arch == Arch::gpt2, cfg.norm_eps),
      mlp_norm_(store, name + ".mlp_norm", cfg.d_model, cfg.arch == Arch::gpt2, cfg.norm_eps),
      attn_(store, name + ".attn", cfg),
      mlp_(store, name + ".mlp", cfg) {}

const float* Block::forward(StepContext& ctx, const float* x) {
  const int64_t N = ctx.batch * cfg_.seq_len, C = cfg_.d_model;
  Saved& s = slots_.at(ctx.slot);
  if (s.out.numel() != N * C) {
    auto act = [&](int64_t n) { return Buffer(ctx.alloc, Shape{n}, DType::f32, Charge::activations); };
    s.n1 = act(N * C), s.h = act(N * C), s.n2 = act(N * C), s.out = act(N * C);
    s.rstd1 = act(N), s.rstd2 = act(N);
    if (attn_norm_.layernorm()) s.mean1 = act(N), s.mean2 = act(N);
  }
  s.x = x;
  attn_norm_.forward(x, s.n1.f32(), s.mean1.f32(), s.rstd1.f32(), N);
  kernels::copy(x, s.h.f32(), N * C);
  attn_.forward(ctx, s.n1.f32(), s.h.f32());
  mlp_norm_.forward(s.h.f32(), s.n2.f32(), s.mean2.f32(), s.rstd2.f32(), N);
  kernels::copy(s.h.f32(), s.out.f32(), N * C);
  mlp_.forward(ctx, s.n2.f32(), s.out.f32());
  return s.out.f32();
}

void Block::backward(StepContext& ctx, const float* dy, float* dx) {
  const int64_t N = ctx.batch * cfg_.seq_len, C = cfg_.d_model;
  Saved& s = slots_.at(ctx.slot);
  float* d_norm = ctx.scratch.get(kDNorm, N * C);
  float* dh = ctx.scratch.get(kDh, N * C);
  // y = h + mlp(n2(h))
  mlp_.backward(ctx, s.n2.f32(), dy, d_norm);
  mlp_norm_.backward(s.h.f32(), d_norm, s.mean2.f32(), s.rstd2.f32(), dh, N);
  kernels::add_inplace(dh, dy, N * C);
  // h = x + attn(n1(x))
  attn_.backward(ctx, s.n1.f32(), dh, d_norm);
  attn_norm_.backward(s.x, d_norm, s.mean1.f32(), s.rstd1.f32(), dx, N);
  kernels::add_inplace(dx, dh, N * C);
}

}  // namespace tessera
