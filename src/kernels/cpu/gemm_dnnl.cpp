// GEMM on the CPU through oneDNN (the library PyTorch uses on CPU; its OpenMP runtime is the
// same one tessera's loops use, so there is one threading model per process).
#include <oneapi/dnnl/dnnl.h>

#include <stdexcept>
#include <string>

#include "kernels/backend.hpp"

namespace tessera::kernels::cpu {

void matmul(const float* A, const float* B, float* C, int64_t M, int64_t N, int64_t K,
            bool trans_a, bool trans_b, float alpha, float beta) {
  if (M == 0 || N == 0) return;
  const dnnl_dim_t lda = trans_a ? M : K;
  const dnnl_dim_t ldb = trans_b ? K : N;
  const dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, alpha,
                                      A, lda, B, ldb, beta, C, N);
  if (st != dnnl_success)
    throw std::runtime_error("dnnl_sgemm failed with status " + std::to_string(int(st)));
}

void register_gemm(Backend& b) {
  b.matmul = matmul;
}

}  // namespace tessera::kernels::cpu
