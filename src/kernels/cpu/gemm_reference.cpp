// CPU GEMM without oneDNN: plain OpenMP loops, accumulated in double. Built only where oneDNN is
// missing (a TESSERA_KERNELS_ONLY build on a GPU machine, where the CPU backend is just the
// reference the CUDA kernels are tested against); slow, never used for training.
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "kernels/backend.hpp"

namespace tessera::kernels::cpu {

void matmul(const float* A, const float* B, float* C, int64_t M, int64_t N, int64_t K, bool trans_a,
            bool trans_b, float alpha, float beta) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < K; ++p) {
        const float a = trans_a ? A[p * M + i] : A[i * K + p];
        const float b = trans_b ? B[j * K + p] : B[p * N + j];
        acc += double(a) * b;
      }
      float& c = C[i * N + j];
      c = beta == 0.0f ? float(alpha * acc) : float(alpha * acc + double(beta) * c);
    }
}

// 16-bit operands widened to f32 (exact), then the loops above.
void matmul_half(DType ab, const uint16_t* A, const uint16_t* B, void* C, DType c_dtype, int64_t M,
                 int64_t N, int64_t K, bool trans_a, bool trans_b, float alpha, float beta) {
  if (c_dtype != DType::f32) throw std::runtime_error("matmul: 16-bit operands need an f32 C here");
  std::vector<float> a(size_t(M * K)), b(size_t(K * N));
  const Backend& cpu = cpu_backend();  // the casts of the table (kernels/kokkos)
  auto widen = ab == DType::bf16 ? cpu.bf16_to_f32 : cpu.f16_to_f32;
  widen(A, a.data(), M * K);
  widen(B, b.data(), K * N);
  matmul(a.data(), b.data(), static_cast<float*>(C), M, N, K, trans_a, trans_b, alpha, beta);
}

bool gemm_native_bf16() { return false; }  // bf16 operands are widened to fp32 here
bool gemm_bf16_matmul() { return false; }
bool gemm_matrix_engine() { return false; }

void register_gemm(Backend& b) {
  b.matmul = matmul;
  b.matmul_half = matmul_half;
}

}  // namespace tessera::kernels::cpu
