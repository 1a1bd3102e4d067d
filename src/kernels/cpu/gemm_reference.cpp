// CPU GEMM without oneDNN: plain OpenMP loops, accumulated in double. Built only where oneDNN is
// missing (a TESSERA_KERNELS_ONLY build on a GPU machine, where the CPU backend is just the
// reference the CUDA kernels are tested against); slow, never used for training.
#include <cstdint>

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

void register_gemm(Backend& b) {
  b.matmul = matmul;
}

}  // namespace tessera::kernels::cpu
