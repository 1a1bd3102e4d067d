// The communication of tensor parallelism, as the layers call it (Megatron-LM's f, g and,
// with sequence parallelism, their all-gather / reduce-scatter forms).
//
// The residual stream holds rows(ctx, N) rows per rank: all N tokens, or N/t with sequence
// parallelism. A column-parallel block reads the whole input (gather), a row-parallel block
// produces a partial sum over ranks (reduce_into); in backward the input gradient of a
// column-parallel block is a partial sum (reduce_grad) and the output gradient is gathered.
// Without sequence parallelism: forward 1 all-reduce per row-parallel block, backward 1 per
// column-parallel input; with it, each all-reduce becomes a reduce-scatter + all-gather pair.
// With one rank every call is a no-op.
#pragma once

#include "model/step_context.hpp"

namespace tessera::tp {

inline int64_t size(const StepContext& ctx) { return ctx.par.tp.size(); }
inline bool sequence_parallel(const StepContext& ctx) {
  return ctx.par.sequence_parallel && ctx.par.tp.size() > 1;
}
// Rows of the residual stream this rank holds, of N tokens.
int64_t rows(const StepContext& ctx, int64_t N);
// Index of this rank's first row among the N.
int64_t first_row(const StepContext& ctx, int64_t N);

// x[rows, C] -> the whole [N, C]: x itself, or all-gathered into `full` (sequence parallel;
// it must hold N * C elements, its shape is not used).
Tensor gather(StepContext& ctx, const Tensor& x, const Tensor& full);
// y[rows, C] (+)= the sum over ranks of partial[N, C] (overwritten): all-reduce, or
// reduce-scatter with sequence parallelism; scratch[rows, C] is used then.
void reduce_into(StepContext& ctx, const Tensor& partial, const Tensor& y, const Tensor& scratch,
                 bool accumulate);
// The gradient of a column-parallel block's input: out[rows, C] = the sum over ranks of
// partial[N, C]; partial may be out without sequence parallelism (all-reduce in place).
void reduce_grad(StepContext& ctx, const Tensor& partial, const Tensor& out);

}  // namespace tessera::tp
