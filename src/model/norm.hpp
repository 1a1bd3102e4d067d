// RMSNorm (llama) or LayerNorm with bias (gpt2). Stateless apart from its parameters: the
// caller keeps x and the row statistics for backward.
#pragma once

#include <string>

#include "model/param.hpp"

namespace tessera {

class Norm {
 public:
  Norm() = default;
  // token_sharded: the norm sees only this rank's tokens (sequence parallelism), so its
  // parameters' gradients are partial sums over the tensor-parallel ranks.
  Norm(ParamStore& store, const std::string& name, int64_t C, bool layernorm, float eps,
       bool token_sharded = false);

  // y[N,C] = norm(x[N,C]); the row statistics mean[N] and rstd[N] are saved for backward
  // (mean is unused, and may be empty, for RMSNorm).
  void forward(const Tensor& x, const Tensor& y, const Tensor& mean, const Tensor& rstd) const;
  // dx[N,C] overwritten; parameter gradients accumulated.
  void backward(const Tensor& x, const Tensor& dy, const Tensor& mean, const Tensor& rstd,
                const Tensor& dx) const;
  bool layernorm() const { return b_ != nullptr; }

 private:
  Param* w_ = nullptr;
  Param* b_ = nullptr;
  int64_t C_ = 0;
  float eps_ = 1e-5f;
};

}  // namespace tessera
