// Internal to kernels/: the implementation table each backend fills. The public functions of
// kernels.hpp check their Tensors (space, dtype, size) and call one entry of the table of the
// tensors' space; the entries take raw pointers of the dtype they implement, so a backend's
// code knows nothing of Tensor.
//
// Adding a kernel: an entry here, its implementation once in kokkos/ (a static function of the
// family's class template, set in its fill(); or, for a kernel that must be specialised, in
// cpu/ and cuda/, where a null entry raises an error naming the kernel and the backend), and the
// checked public function in kernels.hpp and kernels.cpp.
//
// Adding a dtype to a kernel: the DType (tensor/tensor.hpp, with its size and name), an entry
// here for the kernel in that dtype (as matmul_half beside matmul), and the branch in the
// kernel's public function that checks the new dtype and calls that entry. A backend that does
// not fill the entry reports the kernel as not implemented there.
#pragma once

#include <cstdint>

#include "kernels/kernels.hpp"

namespace tessera::kernels {

struct Backend {
  const char* name = nullptr;

  // GEMM (sizes and layout as kernels::matmul).
  void (*matmul)(const float* A, const float* B, float* C, int64_t M, int64_t N, int64_t K,
                 bool trans_a, bool trans_b, float alpha, float beta) = nullptr;
  // 16-bit A and B (bf16 or f16 as ab says; bit patterns), fp32 accumulation, C f32 or of
  // A's dtype as c_dtype says (a backend may take only f32). Optional.
  void (*matmul_half)(DType ab, const uint16_t* A, const uint16_t* B, void* C, DType c_dtype,
                      int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b, float alpha,
                      float beta) = nullptr;
  // matmul_half (alpha 1, beta 0) that may first pack B into space (space_bytes bytes the caller
  // does not need during the call) where that is faster; the same bits either way. Returns
  // whether it packed. Optional: kernels::matmul_packed_b calls matmul_half without it.
  bool (*matmul_half_packed)(DType ab, const uint16_t* A, const uint16_t* B, void* C,
                             DType c_dtype, int64_t M, int64_t N, int64_t K, bool trans_a,
                             bool trans_b, void* space, int64_t space_bytes) = nullptr;

  // elementwise / reductions
  void (*fill)(float* x, float value, int64_t n) = nullptr;
  void (*copy)(const float* x, float* y, int64_t n) = nullptr;
  void (*add_inplace)(float* y, const float* x, int64_t n) = nullptr;
  void (*scale_inplace)(float* x, float alpha, int64_t n) = nullptr;
  double (*sum_squares)(const float* x, int64_t n) = nullptr;
  void (*sum_squares_accumulate)(const float* x, int64_t n, double* total) = nullptr;
  void (*bias_backward)(const float* dy, float* db, int64_t N, int64_t C) = nullptr;
  void (*bias_add)(float* y, const float* b, int64_t N, int64_t C) = nullptr;
  void (*copy_rows)(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t rows,
                    int64_t cols) = nullptr;

  // casts between f32 and the 16-bit floating types (round to nearest even)
  void (*f32_to_bf16)(const float* x, uint16_t* y, int64_t n) = nullptr;
  void (*bf16_to_f32)(const uint16_t* x, float* y, int64_t n) = nullptr;
  void (*f32_to_f16)(const float* x, uint16_t* y, int64_t n) = nullptr;
  void (*f16_to_f32)(const uint16_t* x, float* y, int64_t n) = nullptr;

  // normalisation; the forwards write y (f32) or y16 (bf16, or f16 when f16), one of them
  void (*rmsnorm_forward)(const float* x, const float* w, float* y, uint16_t* y16, bool f16,
                          float* rstd, int64_t N, int64_t C, float eps) = nullptr;
  void (*rmsnorm_backward)(const float* dy, const float* x, const float* w, const float* rstd,
                           float* dx, float* dw, int64_t N, int64_t C) = nullptr;
  void (*layernorm_forward)(const float* x, const float* w, const float* b, float* y,
                            uint16_t* y16, bool f16, float* mean, float* rstd, int64_t N,
                            int64_t C, float eps) = nullptr;
  void (*layernorm_backward)(const float* dy, const float* x, const float* w, const float* mean,
                             const float* rstd, float* dx, float* dw, float* db, int64_t N,
                             int64_t C) = nullptr;

  // activations
  void (*swiglu_forward)(const float* gate, const float* up, float* out, int64_t n) = nullptr;
  void (*swiglu_backward)(const float* dout, const float* gate, const float* up, float* dgate,
                          float* dup, int64_t n) = nullptr;
  void (*gelu_forward)(const float* x, float* y, int64_t n) = nullptr;
  void (*gelu_backward)(const float* dy, const float* x, float* dx, int64_t n) = nullptr;

  // fused MLP epilogues (kokkos/epilogue.cpp; sizes and optional outputs as kernels.hpp's
  // functions of the same names: a null pointer is an output not written or a bias absent).
  // act16 / dpre16 / dgate16 / dup16: bf16, or f16 when f16 is set.
  void (*gelu_bias_forward)(float* pre, const float* bias, float* act, uint16_t* act16, bool f16,
                            int64_t N, int64_t C) = nullptr;
  void (*swiglu_bias_forward)(float* gate, float* up, const float* gate_bias, const float* up_bias,
                              float* act, uint16_t* act16, bool f16, int64_t N,
                              int64_t C) = nullptr;
  void (*gelu_bias_backward)(const float* dact, const float* pre, float* dpre, uint16_t* dpre16,
                             bool f16, float* dbias, int64_t N, int64_t C) = nullptr;
  void (*swiglu_bias_backward)(const float* dact, const float* gate, const float* up,
                               float* dgate, float* dup, uint16_t* dgate16, uint16_t* dup16,
                               bool f16, float* dgate_bias, float* dup_bias, int64_t N,
                               int64_t C) = nullptr;

  // rotary position embedding; y16: null (x rotated in place) or a bf16 output for the rotated
  // x rounded (x is then left as it was)
  void (*rope)(float* x, uint16_t* y16, int64_t B, int64_t T, int64_t H, int64_t D, int64_t pos0,
               float theta, bool inverse) = nullptr;
  void (*rope_at)(float* x, uint16_t* y16, const int32_t* pos, int64_t N, int64_t H, int64_t D,
                  float theta, bool inverse) = nullptr;

  // causal attention; doc_start: [B, T] document starts (kernels.hpp), or null
  void (*attention_forward)(const float* q, const float* k, const float* v, float* out, float* lse,
                            const AttnShape& s, const int32_t* doc_start) = nullptr;
  void (*attention_backward)(const float* dout, const float* q, const float* k, const float* v,
                             const float* out, const float* lse, float* dq, float* dk, float* dv,
                             const AttnShape& s, const int32_t* doc_start) = nullptr;
  // The same with q, k, v in bf16 (AttnShape::compute bf16), the output written to out (f32) or
  // out16 (bf16), one of them, and read from out or out16 by the backward.
  void (*attention_forward_bf16)(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                 float* out, uint16_t* out16, float* lse, const AttnShape& s,
                                 const int32_t* doc_start) = nullptr;
  void (*attention_backward_bf16)(const float* dout, const uint16_t* q, const uint16_t* k,
                                  const uint16_t* v, const float* out, const uint16_t* out16,
                                  const float* lse, float* dq, float* dk, float* dv,
                                  const AttnShape& s, const int32_t* doc_start) = nullptr;
  void (*attention_merge)(float* out, float* lse, const float* out_part, const float* lse_part,
                          int64_t B, int64_t T, int64_t H, int64_t D) = nullptr;

  // embedding
  void (*embedding_forward)(const int32_t* ids, const float* table, float* out, int64_t N,
                            int64_t C) = nullptr;
  void (*embedding_backward)(const int32_t* ids, const float* dout, float* dtable, int64_t N,
                             int64_t C) = nullptr;
  void (*embedding_forward_range)(const int32_t* ids, const float* table, float* out, int64_t N,
                                  int64_t C, int64_t v0, int64_t rows) = nullptr;
  void (*embedding_backward_range)(const int32_t* ids, const float* dout, float* dtable, int64_t N,
                                   int64_t C, int64_t v0, int64_t rows) = nullptr;

  // cross-entropy
  // dlogits: nullptr (the gradient replaces the logits) or a 16-bit buffer (f16 or bf16)
  void (*cross_entropy_fused)(float* logits, const int32_t* targets, float* losses, int64_t N,
                              int64_t V, int64_t V_valid, float grad_scale, uint16_t* dlogits,
                              bool f16) = nullptr;
  void (*cross_entropy_local_max)(const float* logits, float* row_max, int64_t N, int64_t V,
                                  int64_t V_valid) = nullptr;
  void (*cross_entropy_local_exp)(float* logits, const int32_t* targets, const float* row_max,
                                  double* sum_exp, float* target_logit, int64_t N, int64_t V,
                                  int64_t V_valid, int64_t v0) = nullptr;
  void (*cross_entropy_local_finish)(float* logits, const int32_t* targets, const double* sum_exp,
                                     const float* target_logit, float* losses, int64_t N, int64_t V,
                                     int64_t V_valid, int64_t v0, float grad_scale,
                                     uint16_t* dlogits, bool f16) = nullptr;
  // over vocabulary tiles (kernels.hpp's cross_entropy_tile_*)
  void (*cross_entropy_tile_stats)(const float* logits, const int32_t* targets, float* row_max,
                                   double* sum_exp, float* target_logit, int64_t N, int64_t T,
                                   int64_t c0, bool first) = nullptr;
  void (*cross_entropy_rescale)(double* sum_exp, const float* local_max, const float* row_max,
                                int64_t N) = nullptr;
  void (*cross_entropy_tile_loss)(const int32_t* targets, const float* row_max,
                                  const double* sum_exp, const float* target_logit,
                                  float* losses, int64_t N) = nullptr;
  void (*cross_entropy_tile_grad)(float* logits, const int32_t* targets, const float* row_max,
                                  const double* sum_exp, int64_t N, int64_t T, int64_t c0,
                                  float grad_scale, uint16_t* dlogits, bool f16) = nullptr;

  // mixture-of-experts routing (kokkos/routing.cpp; sizes and optional outputs as kernels.hpp's
  // moe_* functions: a null pointer is an output not written or an input absent)
  void (*moe_scores)(const float* logits, float* scores, double* lse, double* norm, int64_t N,
                     int64_t E, bool sigmoid) = nullptr;
  void (*moe_top_k)(const float* scores, const float* bias, int32_t* choice, float* weight,
                    int64_t N, int64_t E, int64_t K, int64_t nodes, int64_t max_nodes,
                    bool normalise) = nullptr;
  void (*moe_capacity)(const int32_t* choice, int32_t* load, int32_t* kept, int32_t* row,
                       int64_t B, int64_t T, int64_t K, int64_t E, int64_t cap, int64_t first,
                       int64_t count) = nullptr;
  void (*moe_balance)(const float* scores, const double* norm, const int32_t* load, float* f,
                      double* aux, int64_t B, int64_t T, int64_t K, int64_t E) = nullptr;
  void (*moe_pack)(const int32_t* choice, int32_t* kept, int32_t* offset, int32_t* row,
                   int64_t B, int64_t T, int64_t K, int64_t E) = nullptr;
  void (*moe_route_stats)(const double* lse, const int32_t* load, const double* aux,
                          const int32_t* outside, double* stats, int64_t B, int64_t T, int64_t K,
                          int64_t E, int64_t cap, double z0, double aux0, int64_t first,
                          int64_t count, int64_t lo, int64_t hi) = nullptr;
  void (*moe_gather)(const float* x, const int32_t* row, float* packed, int64_t first,
                     int64_t count, int64_t K, int64_t C) = nullptr;
  void (*moe_combine)(const float* packed, const int32_t* row, const float* weight, float* y,
                      int64_t first, int64_t count, int64_t y_first, int64_t K,
                      int64_t C) = nullptr;
  void (*moe_combine_backward)(const float* dy, const float* packed, const int32_t* row,
                               const float* weight, float* d_packed, float* dweight,
                               int64_t first, int64_t count, int64_t dy_first, int64_t K,
                               int64_t C) = nullptr;
  void (*moe_router_backward)(const float* logits, const float* scores, const int32_t* choice,
                              const float* weight, const float* dweight, const float* f,
                              float* dlogits, int64_t first, int64_t count, int64_t T, int64_t E,
                              int64_t K, bool sigmoid, double aux, double z) = nullptr;

  // optimizer
  // compute: null, or p's 16-bit compute copy (f16 or bf16), refreshed in the same pass
  void (*adamw)(float* p, const float* g, float* m, float* v, int64_t n, const AdamWArgs& a,
                uint16_t* compute, bool f16) = nullptr;
};

// Under emulation (cuda_emulated()): whether p is inside a block of an emulated device.
bool in_emulated_device(const void* p);

// The table of each backend, filled once on first use. cuda_backend() exists only in a build
// with TESSERA_CUDA.
const Backend& cpu_backend();
const Backend& cuda_backend();

// The specialised implementations, each filling its family's entries: the GEMMs (oneDNN,
// cuBLAS) and attention (cpu/attention.cpp, cuda/attention.cu).
namespace cpu {
void register_gemm(Backend& b);
void register_attention(Backend& b);
bool gemm_native_bf16();  // kernels::cpu_native_bf16, from the GEMM library in use
bool gemm_bf16_matmul();  // kernels::cpu_bf16_matmul
bool gemm_matrix_engine();  // kernels::cpu_matrix_engine
}  // namespace cpu

// The Kokkos kernels (kernels/kokkos/, doc/kokkos.md): every other entry, one source for both
// tables, filled with the instances of one target space.
namespace kokkos {
enum class Target { host, cuda };
void register_all(Backend& b, Target t);  // every family of kernels/kokkos/
}  // namespace kokkos

namespace cuda {
void register_gemm(Backend& b);
void register_attention(Backend& b);
}  // namespace cuda

}  // namespace tessera::kernels
