#include "model/norm.hpp"

#include "kernels/kernels.hpp"
#include "model/step_context.hpp"

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

void Norm::forward(const Tensor& x, const Tensor& y, const Tensor& mean, const Tensor& rstd) const {
  const int64_t N = rows_of(x, C_, "Norm::forward x");
  if (b_)
    kernels::layernorm_forward(x, w_->value, b_->value, y, mean, rstd, N, C_, eps_);
  else
    kernels::rmsnorm_forward(x, w_->value, y, rstd, N, C_, eps_);
}

void Norm::backward(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& rstd,
                    const Tensor& dx) const {
  const int64_t N = rows_of(x, C_, "Norm::backward x");
  if (b_)
    kernels::layernorm_backward(dy, x, w_->value, mean, rstd, dx, w_->grad, b_->grad, N, C_);
  else
    kernels::rmsnorm_backward(dy, x, w_->value, rstd, dx, w_->grad, N, C_);
}

}  // namespace tessera
