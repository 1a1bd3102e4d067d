// The CUDA backend of the kernel API: every function of kernels/kernels.hpp with the same
// signature and the same arithmetic, on device pointers, one .cu file per family:
//   gemm_cublas.cu  matmul (cuBLAS, fp32 without TF32), matmul_bf16 (fp32 accumulation)
//   elementwise.cu  fill, copy, add/scale in place, bias add/backward, sum_squares, bf16 casts
//   norm.cu         RMSNorm, LayerNorm forward/backward
//   activation.cu   SwiGLU, GELU forward/backward
//   rope.cu         rotary embedding
//   attention.cu    causal attention, FlashAttention-2 style tiles with an online softmax
//   embedding.cu    lookup and scatter-add backward (whole and vocabulary-parallel tables)
//   cross_entropy.cu fused softmax cross-entropy and its vocabulary-parallel passes
//   adamw.cu        the optimizer step
//   context.cu      Context, CudaMemory
//
// What the CPU signatures cannot carry (the stream, the cuBLAS handle, scratch memory) comes
// from the calling thread's current Context, set by a ContextScope: kernels are queued on its
// stream and return without waiting, except sum_squares, which returns a host value. A kernel
// called with no current context raises tessera::Error. Reductions are deterministic (fixed
// partition and order, no floating-point atomics); row statistics and parameter-gradient sums
// are accumulated in double like the CPU backend.
//
// Errors: CUDA and cuBLAS failures raise tessera::Error (local to the rank) naming the call;
// a fault inside a kernel surfaces at the next synchronising call (Context::synchronize()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/kernels.hpp"
#include "tensor/device_pool.hpp"

struct CUstream_st;    // cudaStream_t is CUstream_st*
struct cublasContext;  // cublasHandle_t is cublasContext*

namespace tessera::kernels::cuda {

// Number of visible CUDA devices (0 when there is no driver or no device).
int device_count();

// Device memory for a DevicePool: cudaMalloc/cudaFree; zero() is queued on `stream`, the
// stream the pool's blocks are used on.
class CudaMemory : public RawMemory {
 public:
  explicit CudaMemory(CUstream_st* stream) : stream_(stream) {}
  void* allocate(size_t bytes) override;  // nullptr when the device is out of memory
  void release(void* p) override;         // waits for the stream first
  void zero(void* p, size_t bytes) override;
  Space space() const override { return Space::cuda; }

 private:
  CUstream_st* stream_;
};

// One device's stream, cuBLAS handle and memory. Everything a Context's kernels allocate
// (cuBLAS workspace, scratch) comes from its pool(), charged to Charge::workspace; callers
// allocate their tensors from the same pool so one ledger covers the device.
class Context {
 public:
  // device < 0: the calling thread's current device. Creates a stream (blocking with respect
  // to the legacy default stream), a cuBLAS handle on it with TF32 off, and a 32 MiB cuBLAS
  // workspace.
  explicit Context(int device = -1);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int device() const;
  CUstream_st* stream() const;
  cublasContext* blas() const;
  DevicePool& pool() const;
  int sm_count() const;
  size_t max_shared_per_block() const;  // opt-in limit of dynamic shared memory, bytes
  // Waits for the stream; raises any error a kernel on it hit.
  void synchronize() const;
  // At least `bytes` of device memory for one kernel call's temporaries, reused by the next
  // call (stream order makes that safe). Grows, never shrinks.
  void* scratch(size_t bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Makes ctx the calling thread's current context (and its device the current device) for this
// object's lifetime; the previous one is restored after.
class ContextScope {
 public:
  explicit ContextScope(Context& ctx);
  ~ContextScope();
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  Context* previous_;
};

// The calling thread's current context; tessera::Error when there is none.
Context& current();

// ---- GEMM (gemm_cublas.cu) ----------------------------------------------------------------
// As kernels::matmul. fp32 inputs, fp32 compute (no TF32 unless NVIDIA_TF32_OVERRIDE=1).
void matmul(const float* A, const float* B, float* C, int64_t M, int64_t N, int64_t K, bool trans_a,
            bool trans_b, float alpha = 1.0f, float beta = 0.0f);
// Same layout rules; A and B hold bf16 values (raw bit patterns), products are accumulated in
// fp32, C is fp32 or bf16 as c_dtype says (DType::f32 or DType::bf16).
void matmul_bf16(const uint16_t* A, const uint16_t* B, void* C, DType c_dtype, int64_t M, int64_t N,
                 int64_t K, bool trans_a, bool trans_b, float alpha = 1.0f, float beta = 0.0f);

// ---- elementwise / reductions (elementwise.cu) ---------------------------------------------
void fill(float* x, float value, int64_t n);
void copy(const float* x, float* y, int64_t n);
void add_inplace(float* y, const float* x, int64_t n);
void scale_inplace(float* x, float alpha, int64_t n);
// sum x^2 in fp64, returned to the host (waits for the stream).
double sum_squares(const float* x, int64_t n);
// *total += sum x^2 in fp64, on the device, without waiting: a gradient norm over many tensors
// with one copy back at the end. total is a device pointer.
void sum_squares_accumulate(const float* x, int64_t n, double* total);
void bias_backward(const float* dy, float* db, int64_t N, int64_t C);
void bias_add(float* y, const float* b, int64_t N, int64_t C);
// Round to nearest even (NaN stays NaN), and back.
void to_bf16(const float* x, uint16_t* y, int64_t n);
void to_f32(const uint16_t* x, float* y, int64_t n);

// ---- normalisation (norm.cu) -----------------------------------------------------------------
void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t N, int64_t C,
                     float eps);
void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                      float* dw, int64_t N, int64_t C);
void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean,
                       float* rstd, int64_t N, int64_t C, float eps);
void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean,
                        const float* rstd, float* dx, float* dw, float* db, int64_t N, int64_t C);

// ---- activations (activation.cu) -------------------------------------------------------------
void swiglu_forward(const float* gate, const float* up, float* out, int64_t n);
void swiglu_backward(const float* dout, const float* gate, const float* up, float* dgate,
                     float* dup, int64_t n);
void gelu_forward(const float* x, float* y, int64_t n);
void gelu_backward(const float* dy, const float* x, float* dx, int64_t n);

// ---- rotary position embedding (rope.cu) -----------------------------------------------------
void rope(float* x, int64_t B, int64_t T, int64_t H, int64_t D, int64_t pos0, float theta,
          bool inverse);

// ---- causal attention (attention.cu) ---------------------------------------------------------
// D <= 128 (padded inside to 32, 64 or 128); tessera::Error otherwise.
void attention_forward(const float* q, const float* k, const float* v, float* out, float* lse,
                       const AttnShape& s);
void attention_backward(const float* dout, const float* q, const float* k, const float* v,
                        const float* out, const float* lse, float* dq, float* dk, float* dv,
                        const AttnShape& s);

// ---- embedding (embedding.cu) ----------------------------------------------------------------
// The backward passes sort the token ids (CUB radix sort, stable) and add each row's
// gradients in token order: deterministic, and the same sums in the same order as the CPU.
void embedding_forward(const int32_t* ids, const float* table, float* out, int64_t N, int64_t C);
void embedding_backward(const int32_t* ids, const float* dout, float* dtable, int64_t N, int64_t C);
void embedding_forward_range(const int32_t* ids, const float* table, float* out, int64_t N,
                             int64_t C, int64_t v0, int64_t rows);
void embedding_backward_range(const int32_t* ids, const float* dout, float* dtable, int64_t N,
                              int64_t C, int64_t v0, int64_t rows);

// ---- cross-entropy (cross_entropy.cu) --------------------------------------------------------
void cross_entropy_fused(float* logits, const int32_t* targets, float* losses, int64_t N, int64_t V,
                         int64_t V_valid, float grad_scale);
void cross_entropy_local_max(const float* logits, float* row_max, int64_t N, int64_t V,
                             int64_t V_valid);
void cross_entropy_local_exp(float* logits, const int32_t* targets, const float* row_max,
                             double* sum_exp, float* target_logit, int64_t N, int64_t V,
                             int64_t V_valid, int64_t v0);
void cross_entropy_local_finish(float* logits, const int32_t* targets, const double* sum_exp,
                                const float* target_logit, float* losses, int64_t N, int64_t V,
                                int64_t V_valid, int64_t v0, float grad_scale);

// ---- optimizer (adamw.cu) --------------------------------------------------------------------
void adamw(float* p, const float* g, float* m, float* v, int64_t n, const AdamWArgs& a);

}  // namespace tessera::kernels::cuda
