// The MLP sublayer: SwiGLU (llama) or GELU (gpt2), added onto the residual stream.
#pragma once

#include <string>

#include "model/config.hpp"
#include "model/linear.hpp"
#include "model/step_context.hpp"

namespace tessera {

// A hidden gradient [rows, F] of an MLP's fused backward (kernels::gelu_bias_backward and
// swiglu_bias_backward) in scratch buffer `id`: fp32, or, when the GEMMs multiply in 16 bits
// (t), only its 16-bit operand, at the start of the fp32 buffer (which is requested all the same,
// so the workspace stays what perf/ counts).
Tensor hidden_grad(StepContext& ctx, ScratchId id, int64_t rows, int64_t F, DType t);

class Mlp {
 public:
  // What backward reads: the hidden tensors and the activation's output (in down's operand
  // dtype: 16 bits in a 16-bit run).
  struct Saved {
    Buffer gate, up, act;  // gate is empty for gpt2 (up holds the GELU input)
  };

  Mlp(ParamStore& store, const std::string& name, const ModelConfig& cfg);
  // As Attention::share: with selective recompute the activation's output (act, recomputed
  // elementwise from gate and up), with full recompute everything goes to `shared`.
  void share(Saved* shared, Recompute mode) { shared_ = shared, mode_ = mode; }

  // y[rows,C] += down(act(x)) for x[N,C] (kept by the caller until backward); rows as in
  // Attention::forward.
  void forward(StepContext& ctx, const Tensor& x, const Tensor& y);
  // The same forward in two halves, for compute behind a transfer (Moe::forward,
  // doc/moe-overlap.md): forward_hidden runs the gate and up GEMMs into the saved hidden
  // tensors, forward_output the activation, down and its tensor-parallel sum into y. The same
  // GEMMs on the same operands as forward, so the same bits; nothing may run between the two
  // that uses this micro-batch's saved set or the tensor-parallel scratch.
  void forward_hidden(StepContext& ctx, const Tensor& x);
  void forward_output(StepContext& ctx, const Tensor& y);
  // dx[rows,C] overwritten for dy[N,C]; parameter gradients accumulated.
  void backward(StepContext& ctx, const Tensor& x, const Tensor& dy, const Tensor& dx);

 private:
  // Where this micro-batch's gate and up, and the activation's output, live.
  Saved& kept(const StepContext& ctx);
  Saved& activated(const StepContext& ctx);
  // act = swiglu(gate, up) or gelu(up), the biases added first when `bias` (forward) and not
  // when selective recompute reruns it; returns down_'s GEMM operand (mlp.cpp).
  Tensor activate(int64_t N, Saved& in, Saved& out, bool bias) const;

  const ModelConfig& cfg_;
  bool swiglu_;
  Linear gate_, up_, down_;
  Slots<Saved> slots_;
  Saved* shared_ = nullptr;
  Recompute mode_ = Recompute::none;
};

}  // namespace tessera
