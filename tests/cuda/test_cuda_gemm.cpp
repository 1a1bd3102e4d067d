// cuBLAS GEMMs against the CPU GEMM on the same inputs, every transpose combination, with
// alpha/beta. Tolerances (norm-wise ||gpu - cpu|| / ||cpu||):
//   fp32:                               1e-5  (both fp32; TF32 is off)
//   bf16 inputs, fp32 C:                1e-4  vs the CPU fp32 GEMM of the same bf16-rounded
//                                             inputs (tensor-core fp32 accumulation is not
//                                             IEEE round-to-nearest at every addition)
//   bf16 inputs, bf16 C:                4e-3  same reference; C's rounding is 2^-9 relative
//   bf16 inputs vs the unrounded fp32:  1e-2  the inputs' rounding, ~2^-9 each
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_test_util.hpp"

namespace tessera::kernels {
namespace {

using namespace test_cuda;

uint16_t bf16_bits(float x) {  // round to nearest even (no NaNs in these inputs)
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float bf16_value(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

using GemmCase = std::tuple<int64_t, int64_t, int64_t, bool, bool>;  // M, N, K, trans_a, trans_b

class CudaGemm : public CudaTest, public ::testing::WithParamInterface<GemmCase> {};

TEST_P(CudaGemm, Fp32MatchesCpu) {
  const auto [M, N, K, ta, tb] = GetParam();
  const FVec A = randn(M * K, 1), B = randn(K * N, 2), C0 = randn(M * N, 3);
  Dev<float> dA(A), dB(B), dC(C0), dC2(C0);
  FVec C = C0, C2 = C0;
  matmul(host(A), host(B), host(C), M, N, K, ta, tb);
  matmul(host(A), host(B), host(C2), M, N, K, ta, tb, 0.5f, -2.0f);
  matmul(dA, dB, dC, M, N, K, ta, tb);
  matmul(dA, dB, dC2, M, N, K, ta, tb, 0.5f, -2.0f);
  expect_normwise(dC.host(), C, kRel, "C = A B");
  expect_normwise(dC2.host(), C2, kRel, "C = 0.5 A B - 2 C");
}

TEST_P(CudaGemm, Bf16MatchesCpuOnRoundedInputs) {
  const auto [M, N, K, ta, tb] = GetParam();
  const FVec A = randn(M * K, 4), B = randn(K * N, 5);
  std::vector<uint16_t> Ab(A.size()), Bb(B.size());
  FVec Ar(A.size()), Br(B.size());
  for (size_t i = 0; i < A.size(); ++i) Ab[i] = bf16_bits(A[i]), Ar[i] = bf16_value(Ab[i]);
  for (size_t i = 0; i < B.size(); ++i) Bb[i] = bf16_bits(B[i]), Br[i] = bf16_value(Bb[i]);
  FVec want(M * N), exact(M * N);
  matmul(host(Ar), host(Br), host(want), M, N, K, ta, tb);
  matmul(host(A), host(B), host(exact), M, N, K, ta, tb);

  Dev<uint16_t> dA(Ab), dB(Bb), dCb{size_t(M * N)};
  Dev<float> dC{size_t(M * N)}, dCf{size_t(M * N)};
  const Tensor a = dA.as(DType::bf16), b = dB.as(DType::bf16), cb = dCb.as(DType::bf16);
  matmul(a, b, dC, M, N, K, ta, tb);
  matmul(a, b, cb, M, N, K, ta, tb);
  cast(cb, dCf, M * N);
  const FVec got = dC.host(), got_b = dCf.host();
  expect_normwise(got, want, 1e-4, "bf16 GEMM, fp32 C");
  expect_normwise(got_b, want, 4e-3, "bf16 GEMM, bf16 C");
  expect_normwise(got, exact, 1e-2, "bf16 GEMM vs unrounded fp32");
}

std::string gemm_name(const ::testing::TestParamInfo<GemmCase>& info) {
  const auto [M, N, K, ta, tb] = info.param;
  std::ostringstream os;  // not operator+ on strings: GCC 12 warns falsely (-Wrestrict) there
  os << "M" << M << "N" << N << "K" << K << (ta ? "T" : "N") << (tb ? "T" : "N");
  return os.str();
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaGemm,
                         ::testing::Combine(::testing::Values(1, 67), ::testing::Values(1, 130),
                                            ::testing::Values(1, 300), ::testing::Bool(),
                                            ::testing::Bool()),
                         gemm_name);

class CudaGemmShapes : public CudaTest {};

TEST_F(CudaGemmShapes, ModelSizedProductsMatchCpu) {
  // A GPT-2-small MLP product and its two backward orientations on 512 tokens.
  const int64_t T = 512, C = 768, F = 3072;
  const FVec X = randn(T * C, 11), W = randn(C * F, 12, 0.02), dY = randn(T * F, 13);
  Dev<float> dX(X), dW(W), ddY(dY), Y{size_t(T * F)}, dXg{size_t(T * C)}, dWg{size_t(C * F)};
  FVec y(T * F), dx(T * C), dw(C * F);
  matmul(host(X), host(W), host(y), T, F, C, false, false);   // Y = X W
  matmul(host(dY), host(W), host(dx), T, C, F, false, true);  // dX = dY W^T
  matmul(host(X), host(dY), host(dw), C, F, T, true, false);  // dW = X^T dY
  matmul(dX, dW, Y, T, F, C, false, false);
  matmul(ddY, dW, dXg, T, C, F, false, true);
  matmul(dX, ddY, dWg, C, F, T, true, false);
  expect_normwise(Y.host(), y, kRel, "Y = X W");
  expect_normwise(dXg.host(), dx, kRel, "dX = dY W^T");
  expect_normwise(dWg.host(), dw, kRel, "dW = X^T dY");
}

TEST_F(CudaGemmShapes, EmptyInnerDimensionScalesC) {
  const FVec C0 = randn(6, 14);
  Dev<float> dC(C0), dummy{size_t(1)};
  matmul(dummy, dummy, dC, 2, 3, 0, false, false, 1.0f, 0.5f);
  FVec want = C0;
  for (float& x : want) x *= 0.5f;
  expect_close(dC.host(), want, 0.0, "K = 0");
}

}  // namespace
}  // namespace tessera::kernels
