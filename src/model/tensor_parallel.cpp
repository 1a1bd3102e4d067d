#include "model/tensor_parallel.hpp"

#include "kernels/kernels.hpp"

namespace tessera::tp {

int64_t rows(const StepContext& ctx, int64_t N) {
  return sequence_parallel(ctx) ? N / size(ctx) : N;
}

int64_t first_row(const StepContext& ctx, int64_t N) {
  return sequence_parallel(ctx) ? ctx.par.tp.rank() * (N / size(ctx)) : 0;
}

Tensor gather(StepContext& ctx, const Tensor& x, const Tensor& full) {
  if (!sequence_parallel(ctx)) return x;
  const int64_t R = x.shape[0], C = x.shape[1];
  const Tensor whole = view_of(full.data, x.dtype, Shape{R * size(ctx), C}, x.space);
  ctx.par.tp.all_gather(x.slice(0, R * C), whole.slice(0, R * C * size(ctx)));
  return whole;
}

void reduce_into(StepContext& ctx, const Tensor& partial, const Tensor& y, const Tensor& scratch,
                 bool accumulate) {
  const int64_t n = y.numel();
  Tensor sum = partial;
  if (sequence_parallel(ctx)) {
    ctx.par.tp.reduce_scatter(partial.slice(0, n * size(ctx)), scratch.slice(0, n));
    sum = scratch;
  } else if (size(ctx) > 1) {
    ctx.par.tp.all_reduce(partial.slice(0, n));
  }
  if (accumulate)
    kernels::add_inplace(y, sum, n);
  else
    kernels::copy(sum, y, n);
}

void reduce_grad(StepContext& ctx, const Tensor& partial, const Tensor& out) {
  if (sequence_parallel(ctx))
    return ctx.par.tp.reduce_scatter(partial.slice(0, out.numel() * size(ctx)),
                                     out.slice(0, out.numel()));
  const int64_t n = partial.numel();
  if (size(ctx) > 1) ctx.par.tp.all_reduce(partial);
  if (partial.data != out.data) kernels::copy(partial, out, n);
}

}  // namespace tessera::tp
