// A linear map y = x W^T (+ b), W stored [out, in] like torch.nn.Linear. Stateless apart from
// its parameters: the caller keeps x for backward.
//
// Tensor parallelism (Megatron-LM): a column-parallel map holds rows [r*out/t, (r+1)*out/t)
// of W and of b and produces that slice of y; a row-parallel map holds columns
// [r*in/t, (r+1)*in/t) of W, reads that slice of x and produces a partial y that the ranks
// sum; its bias is whole and is added once, after the sum (add_bias).
#pragma once

#include <string>

#include "model/param.hpp"

namespace tessera {

enum class Split { none, column, row };

class Linear {
 public:
  Linear() = default;
  // in, out: the whole map's sizes; tp_size ranks split it as `split` says.
  Linear(ParamStore& store, const std::string& name, int64_t in, int64_t out, bool bias,
         float init_std, Split split = Split::none, int64_t tp_size = 1, int64_t tp_rank = 0);

  // y[N,out] = x[N,in] W^T + b, or y += that when accumulate is set (sizes local; a
  // row-parallel map split over several ranks leaves the bias out). N is x's rows.
  void forward(const Tensor& x, const Tensor& y, bool accumulate = false) const;
  // y[N,out] += b (row-parallel maps, after the sum over ranks).
  void add_bias(const Tensor& y) const;
  // dW += dy^T x, db += colsum(dy); dx[N,in] = dy W (or += when accumulate_dx); dx may be
  // empty (no input gradient). N is dy's rows.
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx,
                bool accumulate_dx = false) const;

  int64_t in() const { return in_; }    // this rank's
  int64_t out() const { return out_; }  // this rank's

 private:
  Param* w_ = nullptr;
  Param* b_ = nullptr;
  int64_t in_ = 0, out_ = 0;
  bool partial_ = false;  // row-parallel over several ranks: y is a partial sum
};

}  // namespace tessera
