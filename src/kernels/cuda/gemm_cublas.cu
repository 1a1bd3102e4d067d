// GEMM through cuBLAS. tessera's matrices are row-major; cuBLAS's are column-major, and a
// row-major [R, C] matrix is the column-major [C, R] one, its transpose. So the row-major
// product C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T: swap the
// operands and the roles of M and N; leading dimensions are the row-major row lengths.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/backend.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/context.hpp"

namespace tessera::kernels::cuda {
namespace {

void gemm(const void* A, const void* B, void* C, cudaDataType ab_type, cudaDataType c_type,
          int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b, float alpha, float beta) {
  TESSERA_REQUIRE_LOCAL(M >= 0 && N >= 0 && K >= 0, "matmul: negative size M=", M, " N=", N,
                        " K=", K);
  if (M == 0 || N == 0) return;
  // Row lengths of A and B as stored (at least 1: cuBLAS checks that even when K = 0).
  const int64_t lda = std::max<int64_t>(1, trans_a ? M : K);
  const int64_t ldb = std::max<int64_t>(1, trans_b ? K : N);
  TESSERA_CUBLAS_CHECK(detail::cublas().gemm_ex_64(
      current().blas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N,
      M, K, &alpha, B, ab_type, ldb, A, ab_type, lda, &beta, C, c_type, N, CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
}

}  // namespace

void matmul(const float* A, const float* B, float* C, int64_t M, int64_t N, int64_t K, bool trans_a,
            bool trans_b, float alpha, float beta) {
  gemm(A, B, C, CUDA_R_32F, CUDA_R_32F, M, N, K, trans_a, trans_b, alpha, beta);
}

void matmul_half(DType ab, const uint16_t* A, const uint16_t* B, void* C, DType c_dtype, int64_t M,
                 int64_t N, int64_t K, bool trans_a, bool trans_b, float alpha, float beta) {
  TESSERA_REQUIRE_LOCAL(c_dtype == DType::f32 || c_dtype == ab,
                        "matmul: C must be f32 or of the operands' dtype");
  const cudaDataType t = ab == DType::bf16 ? CUDA_R_16BF : CUDA_R_16F;
  gemm(A, B, C, t, c_dtype == DType::f32 ? CUDA_R_32F : t, M, N, K, trans_a, trans_b, alpha, beta);
}

void register_gemm(Backend& b) {
  b.matmul = matmul;
  b.matmul_half = matmul_half;
}

}  // namespace tessera::kernels::cuda
