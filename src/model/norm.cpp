#include "model/norm.hpp"

#include "kernels/kernels.hpp"

namespace tessera {

Norm::Norm(ParamStore& store, const std::string& name, int64_t C, bool layernorm, float eps,
           bool token_sharded)
    : C_(C), eps_(eps) {
  w_ = &store.add(name + ".weight", Shape{C}, {ParamInit::ones}, false);
  w_->tp_partial_grad = token_sharded;
  if (layernorm) {
    b_ = &store.add(name + ".bias", Shape{C}, {ParamInit::zeros}, false);
    b_->tp_partial_grad = token_sharded;
  }
}

void Norm::forward(const float* x, float* y, float* mean, float* rstd, int64_t N) const {
  if (b_)
    kernels::layernorm_forward(x, w_->value.f32(), b_->value.f32(), y, mean, rstd, N, C_, eps_);
  else
    kernels::rmsnorm_forward(x, w_->value.f32(), y, rstd, N, C_, eps_);
}

void Norm::backward(const float* x, const float* dy, const float* mean, const float* rstd,
                    float* dx, int64_t N) const {
  if (b_)
    kernels::layernorm_backward(dy, x, w_->value.f32(), mean, rstd, dx, w_->grad.f32(),
                                b_->grad.f32(), N, C_);
  else
    kernels::rmsnorm_backward(dy, x, w_->value.f32(), rstd, dx, w_->grad.f32(), N, C_);
}

}  // namespace tessera
