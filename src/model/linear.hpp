// A linear map y = x W^T (+ b), W stored [out, in] like torch.nn.Linear. Stateless apart from
// its parameters: the caller keeps x for backward.
//
// Tensor parallelism (Megatron-LM): a column-parallel map holds rows [r*out/t, (r+1)*out/t)
// of W and of b and produces that slice of y; a row-parallel map holds columns
// [r*in/t, (r+1)*in/t) of W, reads that slice of x and produces a partial y that the ranks
// sum; its bias is whole and is added once, after the sum (add_bias).
//
// Precision: the map computes in the dtype of its weight's compute copy (Param::compute): f32,
// or bf16 / f16 under train.precision, where x and dy are cast to that dtype and the GEMMs
// accumulate in fp32 into fp32 y, dx and dW (doc/precision.md). A caller that feeds one input to
// several maps casts it once with operand() and passes the result.
#pragma once

#include <string>

#include "model/param.hpp"
#include "model/step_context.hpp"

namespace tessera {

enum class Split { none, column, row };

// x as a GEMM operand in dtype t: x itself when it has that dtype, else x cast to it in scratch
// buffer `id` (valid until the next use of that buffer).
Tensor gemm_operand(StepContext& ctx, const Tensor& x, DType t, ScratchId id);

class Linear {
 public:
  Linear() = default;
  // in, out: the whole map's sizes; tp_size ranks split it as `split` says.
  Linear(ParamStore& store, const std::string& name, int64_t in, int64_t out, bool bias,
         float init_std, Split split = Split::none, int64_t tp_size = 1, int64_t tp_rank = 0);

  // y[N,out] = x[N,in] W^T + b, or y += that when accumulate is set (sizes local; a
  // row-parallel map split over several ranks leaves the bias out). N is x's rows.
  void forward(StepContext& ctx, const Tensor& x, const Tensor& y, bool accumulate = false) const;
  // y[N,out] += b (row-parallel maps, after the sum over ranks).
  void add_bias(const Tensor& y) const;
  // dW += dy^T x, db += colsum(dy); dx[N,in] = dy W (or += when accumulate_dx); dx may be
  // empty (no input gradient). N is dy's rows. With ctx.weight_grads set (a split backward's
  // backward_input pass) dW += dy^T x is queued there, not computed.
  void backward(StepContext& ctx, const Tensor& x, const Tensor& dy, const Tensor& dx,
                bool accumulate_dx = false) const;
  // x as a GEMM operand of this map: x itself when it has the compute dtype, else x cast to it
  // in scratch buffer `id` (valid until the next use of that buffer).
  Tensor operand(StepContext& ctx, const Tensor& x, ScratchId id = ScratchId::gemm_x) const;

  // The GEMMs alone, for a caller whose fused epilogue (kernels::gelu_bias_forward and the
  // others) adds the bias and sums its gradient itself: forward without adding the bias, and
  // backward without its gradient. x and dy may be operands in the compute dtype already
  // (written by that epilogue); then they are not cast again.
  void forward_gemm(StepContext& ctx, const Tensor& x, const Tensor& y,
                    bool accumulate = false) const;
  void backward_gemms(StepContext& ctx, const Tensor& x, const Tensor& dy, const Tensor& dx,
                      bool accumulate_dx = false) const;
  // The bias and its gradient (empty Tensors without a bias), and the GEMMs' operand dtype.
  Tensor bias() const { return b_ ? b_->value : Tensor{}; }
  Tensor bias_grad() const { return b_ ? b_->grad : Tensor{}; }
  DType compute_dtype() const { return w_->compute.dtype; }

  int64_t in() const { return in_; }    // this rank's
  int64_t out() const { return out_; }  // this rank's

 private:
  Param* w_ = nullptr;
  Param* b_ = nullptr;
  int64_t in_ = 0, out_ = 0;
  bool partial_ = false;  // row-parallel over several ranks: y is a partial sum
};

}  // namespace tessera
