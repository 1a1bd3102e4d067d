#include "model/embedding.hpp"

#include "kernels/kernels.hpp"
#include "model/tensor_parallel.hpp"

namespace tessera {
Param& Embedding::add_token_table(ParamStore& store, const ModelConfig& cfg) {
  // Vocabulary-parallel: each tensor-parallel rank holds a block of rows of the table.
  return store.add("embed.tok.weight", Shape{cfg.vocab_padded, cfg.d_model},
                   {ParamInit::normal, cfg.init_std, cfg.vocab}, false,
                   cfg.tp.size > 1 ? TpSplit{0, cfg.tp.size, cfg.tp.rank} : TpSplit{});
}

Embedding::Embedding(ParamStore& store, const ModelConfig& cfg) : cfg_(cfg) {
  tok_ = &add_token_table(store, cfg);
  if (cfg.arch == Arch::gpt2)
    pos_ = &store.add("embed.pos.weight", Shape{cfg.seq_len, cfg.d_model},
                      {ParamInit::normal, cfg.init_std}, false);
}

Tensor Embedding::forward(StepContext& ctx, const Tensor& ids) {
  const int64_t T = cfg_.seq_local(), N = ctx.batch * T, C = cfg_.d_model, R = tp::rows(ctx, N);
  Saved& s = slots_.at(ctx.slot);
  if (s.x.numel() != R * C) s.x = Buffer(ctx.alloc, Shape{R, C}, DType::f32, Charge::activations);
  s.ids = ids;
  if (tp::size(ctx) > 1) {
    // Each rank looks up the ids in its rows; the sum over ranks is the whole lookup.
    const int64_t rows = cfg_.vocab_local();
    const Tensor partial = ctx.scratch.get(ScratchId::tp_partial, {N, C});
    kernels::embedding_forward_range(ids, tok_->value, partial, N, C, cfg_.tp.rank * rows, rows);
    tp::reduce_into(ctx, partial, s.x.view(), ctx.scratch.get(ScratchId::tp_sum, {R, C}), false);
    if (pos_) {
      const int64_t first = tp::first_row(ctx, N);
      for (int64_t i = 0; i < R; ++i)
        kernels::add_inplace(s.x.view().rows(i, 1),
                             pos_->value.rows(cfg_.position_of(first + i, ctx.batch), 1), C);
    }
    return s.x.view();
  }
  kernels::embedding_forward(ids, tok_->value, s.x.view(), N, C);
  // Each segment of this rank's tokens (context parallelism) is a [B, len] block at global
  // positions [pos0, pos0 + len).
  if (pos_) {
    int64_t row = 0;
    for (const ContextParallel::Segment& g : cfg_.cp.segments(cfg_.seq_len))
      for (int64_t b = 0; b < ctx.batch; ++b, row += g.len)
        kernels::add_inplace(s.x.view().rows(row, g.len), pos_->value.rows(g.pos0, g.len),
                             g.len * C);
  }
  return s.x.view();
}

void Embedding::backward(StepContext& ctx, const Tensor& dx) {
  const int64_t T = cfg_.seq_local(), N = ctx.batch * T, C = cfg_.d_model;
  Saved& s = slots_.at(ctx.slot);
  Tensor d = dx;  // [N, C]: every token's gradient
  if (tp::size(ctx) > 1) {
    d = tp::gather(
        ctx, dx, ctx.scratch.get(ScratchId::sp_gathered, {tp::sequence_parallel(ctx) ? N * C : 1}));
    const int64_t rows = cfg_.vocab_local();
    kernels::embedding_backward_range(s.ids, d, tok_->grad, N, C, cfg_.tp.rank * rows, rows);
  } else {
    kernels::embedding_backward(s.ids, d, tok_->grad, N, C);
  }
  if (pos_) {
    int64_t row = 0;
    for (const ContextParallel::Segment& g : cfg_.cp.segments(cfg_.seq_len))
      for (int64_t b = 0; b < ctx.batch; ++b, row += g.len)
        kernels::add_inplace(pos_->grad.rows(g.pos0, g.len), d.rows(row, g.len), g.len * C);
  }
}

}  // namespace tessera
