// A linear map y = x W^T (+ b), W stored [out, in] like torch.nn.Linear. Stateless apart from
// its parameters: the caller keeps x for backward.
#pragma once

#include <string>

#include "model/param.hpp"

namespace tessera {

class Linear {
 public:
  Linear() = default;
  Linear(ParamStore& store, const std::string& name, int64_t in, int64_t out, bool bias,
         float init_std);

  // y[N,out] = x W^T + b, or y += that when accumulate is set.
  void forward(const float* x, float* y, int64_t N, bool accumulate = false) const;
  // dW += dy^T x, db += colsum(dy); dx[N,in] = dy W (or += when accumulate_dx); dx may be null.
  void backward(const float* x, const float* dy, float* dx, int64_t N,
                bool accumulate_dx = false) const;

  int64_t in() const { return in_; }
  int64_t out() const { return out_; }

 private:
  Param* w_ = nullptr;
  Param* b_ = nullptr;
  int64_t in_ = 0, out_ = 0;
};

}  // namespace tessera
