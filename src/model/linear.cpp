#include "model/linear.hpp"

#include "kernels/kernels.hpp"

namespace tessera {

Linear::Linear(ParamStore& store, const std::string& name, int64_t in, int64_t out, bool bias,
               float init_std)
    : in_(in), out_(out) {
  w_ = &store.add(name + ".weight", Shape{out, in}, {ParamInit::normal, init_std}, true);
  if (bias) b_ = &store.add(name + ".bias", Shape{out}, {ParamInit::zeros}, false);
}

void Linear::forward(const float* x, float* y, int64_t N, bool accumulate) const {
  kernels::matmul(x, w_->value.f32(), y, N, out_, in_, false, true, 1.0f,
                  accumulate ? 1.0f : 0.0f);
  if (b_) kernels::bias_add(y, b_->value.f32(), N, out_);
}

void Linear::backward(const float* x, const float* dy, float* dx, int64_t N,
                      bool accumulate_dx) const {
  kernels::matmul(dy, x, w_->grad.f32(), out_, in_, N, true, false, 1.0f, 1.0f);
  if (b_) kernels::bias_backward(dy, b_->grad.f32(), N, out_);
  if (dx)
    kernels::matmul(dy, w_->value.f32(), dx, N, in_, out_, false, false, 1.0f,
                    accumulate_dx ? 1.0f : 0.0f);
}

}  // namespace tessera
