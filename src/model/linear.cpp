#include "model/linear.hpp"

#include "kernels/kernels.hpp"
#include "model/step_context.hpp"
#include "model/transfers.hpp"
#include "model/weight_grads.hpp"

namespace tessera {

Linear::Linear(ParamStore& store, const std::string& name, int64_t in, int64_t out, bool bias,
               float init_std, Split split, int64_t tp_size, int64_t tp_rank)
    : in_(split == Split::row ? in / tp_size : in),
      out_(split == Split::column ? out / tp_size : out),
      partial_(split == Split::row && tp_size > 1) {
  const TpSplit none;
  const TpSplit w_split = split == Split::none ? none
                          : TpSplit{split == Split::column ? 0 : 1, tp_size, tp_rank};
  w_ = &store.add(name + ".weight", Shape{out, in}, {ParamInit::normal, init_std}, true, w_split);
  if (bias)
    b_ = &store.add(name + ".bias", Shape{out}, {ParamInit::zeros}, false,
                    split == Split::column ? TpSplit{0, tp_size, tp_rank} : none);
}

Tensor gemm_operand(StepContext& ctx, const Tensor& x, DType t, ScratchId id) {
  if (x.dtype == t) return x;
  const Tensor out = ctx.scratch.get(id, x.shape, t);
  kernels::cast(x, out, x.numel());
  return out;
}

Tensor Linear::operand(StepContext& ctx, const Tensor& x, ScratchId id) const {
  return gemm_operand(ctx, x, w_->compute.dtype, id);
}

void Linear::forward(StepContext& ctx, const Tensor& x, const Tensor& y, bool accumulate) const {
  forward_gemm(ctx, x, y, accumulate);
  if (b_ && !partial_) add_bias(y);
}

void Linear::forward_gemm(StepContext& ctx, const Tensor& x, const Tensor& y,
                          bool accumulate) const {
  const int64_t N = rows_of(x, in_, "Linear::forward x");
  kernels::matmul(operand(ctx, x), w_->compute, y, N, out_, in_, false, true, 1.0f,
                  accumulate ? 1.0f : 0.0f);
  ctx.poll_transfers();
}

void Linear::add_bias(const Tensor& y) const {
  if (b_) kernels::bias_add(y, b_->value, rows_of(y, out_, "Linear::add_bias y"), out_);
}

void Linear::backward(StepContext& ctx, const Tensor& x, const Tensor& dy, const Tensor& dx,
                      bool accumulate_dx) const {
  if (b_) kernels::bias_backward(dy, b_->grad, rows_of(dy, out_, "Linear::backward dy"), out_);
  backward_gemms(ctx, x, dy, dx, accumulate_dx);
}

void Linear::backward_gemms(StepContext& ctx, const Tensor& x, const Tensor& dy, const Tensor& dx,
                            bool accumulate_dx) const {
  const int64_t N = rows_of(dy, out_, "Linear::backward dy");
  const Tensor dyc = operand(ctx, dy, ScratchId::gemm_dy);
  if (ctx.weight_grads)  // a split backward's B: W runs it (model/weight_grads.hpp)
    ctx.weight_grads->add(ctx.alloc, dyc, operand(ctx, x), &w_->grad, N, out_, in_);
  else
    kernels::matmul(dyc, operand(ctx, x), w_->grad, out_, in_, N, true, false, 1.0f, 1.0f);
  ctx.poll_transfers();
  if (dx.data)
    kernels::matmul(dyc, w_->compute, dx, N, in_, out_, false, false, 1.0f,
                    accumulate_dx ? 1.0f : 0.0f);
  ctx.poll_transfers();
}

}  // namespace tessera
