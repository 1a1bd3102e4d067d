#include "model/linear.hpp"

#include "kernels/kernels.hpp"

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

void Linear::forward(const float* x, float* y, int64_t N, bool accumulate) const {
  const Tensor ty = view_of(y, {N, out_});
  kernels::matmul(view_of(x, {N, in_}), w_->value, ty, N, out_, in_, false, true, 1.0f,
                  accumulate ? 1.0f : 0.0f);
  if (b_ && !partial_) kernels::bias_add(ty, b_->value, N, out_);
}

void Linear::add_bias(float* y, int64_t N) const {
  if (b_) kernels::bias_add(view_of(y, {N, out_}), b_->value, N, out_);
}

void Linear::backward(const float* x, const float* dy, float* dx, int64_t N,
                      bool accumulate_dx) const {
  const Tensor tdy = view_of(dy, {N, out_});
  kernels::matmul(tdy, view_of(x, {N, in_}), w_->grad, out_, in_, N, true, false, 1.0f, 1.0f);
  if (b_) kernels::bias_backward(tdy, b_->grad, N, out_);
  if (dx)
    kernels::matmul(tdy, w_->value, view_of(dx, {N, in_}), N, in_, out_, false, false, 1.0f,
                    accumulate_dx ? 1.0f : 0.0f);
}

}  // namespace tessera
