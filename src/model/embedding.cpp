#include "model/embedding.hpp"

#include "kernels/kernels.hpp"
#include "model/tensor_parallel.hpp"

namespace tessera {
namespace {

// Document masking: calls f(row, p, len) for each run of rows [row, row + len) of this rank's N
// rows at consecutive positions [p, p + len) in their documents, in row order (so the position
// table's gradient sums in the same order on every call).
template <class F>
void for_each_run(const StepContext& ctx, int64_t N, F f) {
  const int32_t* pos = ctx.docs.position_host;
  for (int64_t row = 0; row < N;) {
    int64_t len = 1;
    while (row + len < N && pos[row + len] == pos[row] + len) ++len;
    f(row, int64_t(pos[row]), len);
    row += len;
  }
}

}  // namespace

// Row n of this rank's tokens: its position in its document with document masking, else its
// global position.
int64_t Embedding::position(const StepContext& ctx, int64_t n) const {
  return ctx.docs.on() ? ctx.docs.position_host[n] : cfg_.position_of(n, ctx.batch);
}

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
        kernels::add_inplace(s.x.view().rows(i, 1), pos_->value.rows(position(ctx, first + i), 1),
                             C);
    }
    return s.x.view();
  }
  kernels::embedding_forward(ids, tok_->value, s.x.view(), N, C);
  // Each segment of this rank's tokens (context parallelism) is a [B, len] block at global
  // positions [pos0, pos0 + len).
  if (pos_ && ctx.docs.on()) {
    for_each_run(ctx, N, [&](int64_t row, int64_t p, int64_t len) {
      kernels::add_inplace(s.x.view().rows(row, len), pos_->value.rows(p, len), len * C);
    });
  } else if (pos_) {
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
  if (pos_ && ctx.docs.on()) {
    for_each_run(ctx, N, [&](int64_t row, int64_t p, int64_t len) {
      kernels::add_inplace(pos_->grad.rows(p, len), d.rows(row, len), len * C);
    });
  } else if (pos_) {
    int64_t row = 0;
    for (const ContextParallel::Segment& g : cfg_.cp.segments(cfg_.seq_len))
      for (int64_t b = 0; b < ctx.batch; ++b, row += g.len)
        kernels::add_inplace(pos_->grad.rows(g.pos0, g.len), d.rows(row, g.len), g.len * C);
  }
}

}  // namespace tessera
