#include "model/tensor_parallel.hpp"

#include "kernels/kernels.hpp"

namespace tessera::tp {

int64_t rows(const StepContext& ctx, int64_t N) {
  return sequence_parallel(ctx) ? N / size(ctx) : N;
}

int64_t first_row(const StepContext& ctx, int64_t N) {
  return sequence_parallel(ctx) ? ctx.par.tp.rank() * (N / size(ctx)) : 0;
}

const float* gather(StepContext& ctx, const float* x, float* full, int64_t N, int64_t C) {
  if (!sequence_parallel(ctx)) return x;
  ctx.par.tp.all_gather(x, full, rows(ctx, N) * C);
  return full;
}

void reduce_into(StepContext& ctx, float* partial, float* y, float* scratch, int64_t N,
                 int64_t C, bool accumulate) {
  const int64_t n = rows(ctx, N) * C;
  float* sum = partial;
  if (sequence_parallel(ctx)) {
    ctx.par.tp.reduce_scatter(partial, scratch, n);
    sum = scratch;
  } else if (size(ctx) > 1) {
    ctx.par.tp.all_reduce(partial, n);
  }
  if (accumulate)
    kernels::add_inplace(view_of(y, {n}), view_of(sum, {n}), n);
  else
    kernels::copy(view_of(sum, {n}), view_of(y, {n}), n);
}

void reduce_grad(StepContext& ctx, float* partial, float* out, int64_t N, int64_t C) {
  if (sequence_parallel(ctx)) return ctx.par.tp.reduce_scatter(partial, out, rows(ctx, N) * C);
  if (size(ctx) > 1) ctx.par.tp.all_reduce(partial, N * C);
  if (partial != out) kernels::copy(view_of(partial, {N, C}), view_of(out, {N, C}), N * C);
}

}  // namespace tessera::tp
