#include "model/block.hpp"

#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "model/tensor_parallel.hpp"

namespace tessera {
Block::Block(ParamStore& store, const std::string& name, const ModelConfig& cfg, Recompute mode,
             Rebuilt* shared, bool moe)
    : cfg_(cfg),
      full_(mode == Recompute::full),
      shared_(shared),
      attn_norm_(store, name + ".attn_norm", cfg.d_model, cfg.arch == Arch::gpt2, cfg.norm_eps,
                 cfg.tp.sequence_parallel && cfg.tp.size > 1),
      mlp_norm_(store, name + ".mlp_norm", cfg.d_model, cfg.arch == Arch::gpt2, cfg.norm_eps,
                cfg.tp.sequence_parallel && cfg.tp.size > 1),
      attn_(store, name + ".attn", cfg) {
  if (moe) moe_ = std::make_unique<Moe>(store, name + ".moe", cfg);
  else mlp_ = std::make_unique<Mlp>(store, name + ".mlp", cfg);
  if (mode == Recompute::none) return;
  TESSERA_REQUIRE(shared != nullptr, "block ", name, ": recompute needs a shared rebuilt set");
  attn_.share(&shared->attn, mode);
  if (moe_)
    moe_->share(&shared->moe, &shared->moe_shared, mode);
  else
    mlp_->share(&shared->mlp, mode);
}

Block::Saved& Block::kept(const StepContext& ctx) {
  Saved& s = slots_.at(ctx.slot);
  const int64_t R = tp::rows(ctx, ctx.batch * cfg_.seq_local()), C = cfg_.d_model;
  if (s.out.numel() != R * C)
    s.out = Buffer(ctx.alloc, Shape{R, C}, DType::f32, Charge::activations);
  return s;
}

Block::Saved& Block::inner(const StepContext& ctx) {
  Saved& s = !full_ ? slots_.at(ctx.slot) : moe_ ? shared_->moe_block : shared_->block;
  const int64_t R = tp::rows(ctx, ctx.batch * cfg_.seq_local()), C = cfg_.d_model;
  if (s.n1.numel() != R * C) {
    auto act = [&](Shape shape, DType t = DType::f32) {
      return Buffer(ctx.alloc, shape, t, Charge::activations);
    };
    // The norms' outputs feed only GEMMs: a 16-bit run keeps them as the GEMMs' operands, in
    // the compute dtype (a mixture of experts packs and routes an fp32 input: not yet).
    const DType t = cfg_.compute;
    s.n1 = act({R, C}, t), s.h = act({R, C}), s.n2 = act({R, C}, moe_ ? DType::f32 : t);
    s.rstd1 = act({R}), s.rstd2 = act({R});
    if (attn_norm_.layernorm()) s.mean1 = act({R}), s.mean2 = act({R});
  }
  return s;
}

// With sequence parallelism the norms and residual adds run on this rank's R = N/t rows; the
// normed input is all-gathered before each sublayer (and again in backward: only the rows
// are kept; in a 16-bit run in 16 bits) and each sublayer reduce-scatters its output. Without
// it R = N.
void Block::run(StepContext& ctx, const Tensor& x, Saved& s, const Tensor& out, bool rerun) {
  const int64_t N = ctx.batch * cfg_.seq_local(), C = cfg_.d_model, R = tp::rows(ctx, N);
  const Tensor full =
      ctx.scratch.get(ScratchId::sp_gathered, {tp::sequence_parallel(ctx) ? N * C : 1});
  attn_norm_.forward(x, s.n1.view(), s.mean1.view(), s.rstd1.view());
  kernels::copy(x, s.h.view(), R * C);
  attn_.forward(ctx, tp::gather(ctx, s.n1.view(), full), s.h.view());
  mlp_norm_.forward(s.h.view(), s.n2.view(), s.mean2.view(), s.rstd2.view());
  kernels::copy(s.h.view(), out, R * C);
  if (moe_)
    moe_->forward(ctx, s.n2.view(), out, rerun);
  else mlp_->forward(ctx, tp::gather(ctx, s.n2.view(), full), out);
}

Tensor Block::forward(StepContext& ctx, const Tensor& x) {
  Saved& k = kept(ctx);
  k.x = x;
  run(ctx, x, inner(ctx), k.out.view());
  return k.out.view();
}

// Full recompute: every activation rebuilt from the kept input with the forward's own
// kernels and collectives, so backward reads the same bits it would have kept. The output
// goes to the shared set: the slot's output may still be the next block's kept input.
void Block::rebuild(StepContext& ctx, const Tensor& x, Saved& s) {
  const int64_t R = tp::rows(ctx, ctx.batch * cfg_.seq_local()), C = cfg_.d_model;
  if (s.out.numel() != R * C)
    s.out = Buffer(ctx.alloc, Shape{R, C}, DType::f32, Charge::activations);
  run(ctx, x, s, s.out.view(), /*rerun=*/true);
}

void Block::backward(StepContext& ctx, const Tensor& dy, const Tensor& dx) {
  const int64_t N = ctx.batch * cfg_.seq_local(), C = cfg_.d_model, R = tp::rows(ctx, N);
  const Tensor x = kept(ctx).x;
  Saved& s = inner(ctx);
  if (full_) rebuild(ctx, x, s);
  const Tensor d_norm = ctx.scratch.get(ScratchId::block_d_norm, {R, C});
  const Tensor dh = ctx.scratch.get(ScratchId::block_dh, {R, C});
  const bool sp = tp::sequence_parallel(ctx);
  const Tensor full = ctx.scratch.get(ScratchId::sp_gathered, {sp ? N * C : 1});
  const Tensor dfull = ctx.scratch.get(ScratchId::sp_gathered_grad, {sp ? N * C : 1});
  // y = h + mlp(n2(h))
  if (moe_) moe_->backward(ctx, s.n2.view(), dy, d_norm);
  else mlp_->backward(ctx, tp::gather(ctx, s.n2.view(), full), tp::gather(ctx, dy, dfull), d_norm);
  mlp_norm_.backward(s.h.view(), d_norm, s.mean2.view(), s.rstd2.view(), dh);
  kernels::add_inplace(dh, dy, R * C);
  // h = x + attn(n1(x))
  attn_.backward(ctx, tp::gather(ctx, s.n1.view(), full), tp::gather(ctx, dh, dfull), d_norm);
  attn_norm_.backward(x, d_norm, s.mean1.view(), s.rstd1.view(), dx);
  kernels::add_inplace(dx, dh, R * C);
}

}  // namespace tessera
