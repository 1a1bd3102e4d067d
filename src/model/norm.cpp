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

// The row statistics are [N] views; mean is absent (empty) for RMSNorm.
void Norm::forward(const float* x, float* y, float* mean, float* rstd, int64_t N) const {
  const Tensor tx = view_of(x, {N, C_}), ty = view_of(y, {N, C_}), tr = view_of(rstd, {N});
  if (b_)
    kernels::layernorm_forward(tx, w_->value, b_->value, ty, view_of(mean, {N}), tr, N, C_, eps_);
  else
    kernels::rmsnorm_forward(tx, w_->value, ty, tr, N, C_, eps_);
}

void Norm::backward(const float* x, const float* dy, const float* mean, const float* rstd,
                    float* dx, int64_t N) const {
  const Tensor tx = view_of(x, {N, C_}), tdy = view_of(dy, {N, C_}), tdx = view_of(dx, {N, C_});
  const Tensor tr = view_of(rstd, {N});
  if (b_)
    kernels::layernorm_backward(tdy, tx, w_->value, view_of(mean, {N}), tr, tdx, w_->grad, b_->grad,
                                N, C_);
  else
    kernels::rmsnorm_backward(tdy, tx, w_->value, tr, tdx, w_->grad, N, C_);
}

}  // namespace tessera
