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

const float* Embedding::forward(StepContext& ctx, const int32_t* ids) {
  const int64_t T = cfg_.seq_len, N = ctx.batch * T, C = cfg_.d_model, R = tp::rows(ctx, N);
  Saved& s = slots_.at(ctx.slot);
  if (s.x.numel() != R * C) s.x = Buffer(ctx.alloc, Shape{R, C}, DType::f32, Charge::activations);
  s.ids = ids;
  const Tensor tids = view_of(ids, {N});
  if (tp::size(ctx) > 1) {
    // Each rank looks up the ids in its rows; the sum over ranks is the whole lookup.
    const int64_t rows = cfg_.vocab_local();
    const Tensor partial = ctx.scratch.get(ScratchId::tp_partial, {N, C});
    kernels::embedding_forward_range(tids, tok_->value, partial, N, C, cfg_.tp.rank * rows, rows);
    tp::reduce_into(ctx, partial.f32(), s.x.f32(), ctx.scratch.get(ScratchId::tp_sum, {R, C}).f32(),
                    N, C, false);
    if (pos_) {
      const int64_t first = tp::first_row(ctx, N);
      for (int64_t i = 0; i < R; ++i)
        kernels::add_inplace(s.x.view().rows(i, 1), pos_->value.rows((first + i) % T, 1), C);
    }
    return s.x.f32();
  }
  kernels::embedding_forward(tids, tok_->value, s.x.view(), N, C);
  if (pos_)
    for (int64_t b = 0; b < ctx.batch; ++b)
      kernels::add_inplace(s.x.view().rows(b * T, T), pos_->value, T * C);
  return s.x.f32();
}

void Embedding::backward(StepContext& ctx, const float* dx) {
  const int64_t T = cfg_.seq_len, N = ctx.batch * T, C = cfg_.d_model;
  Saved& s = slots_.at(ctx.slot);
  const Tensor tids = view_of(s.ids, {N});
  if (tp::size(ctx) > 1) {
    dx = tp::gather(
        ctx, dx,
        ctx.scratch.get(ScratchId::sp_gathered, {tp::sequence_parallel(ctx) ? N * C : 1}).f32(), N,
        C);
    const int64_t rows = cfg_.vocab_local();
    kernels::embedding_backward_range(tids, view_of(dx, {N, C}), tok_->grad, N, C,
                                      cfg_.tp.rank * rows, rows);
  } else {
    kernels::embedding_backward(tids, view_of(dx, {N, C}), tok_->grad, N, C);
  }
  if (pos_)
    for (int64_t b = 0; b < ctx.batch; ++b)
      kernels::add_inplace(pos_->grad, view_of(dx, {N, C}).rows(b * T, T), T * C);
}

}  // namespace tessera
