// The kernel API's dispatch (one space per call, the dtypes a kernel takes, sizes the tensors
// must hold, the cuda space without a usable backend), the f32 <-> bf16 / f16 casts, and the
// ParamStore's compute copy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "../test_vectors.hpp"
#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "model/param.hpp"

#ifdef TESSERA_CUDA
#include "kernels/cuda/context.hpp"
#endif

namespace tessera::kernels {
namespace {

using test::FVec;
using test::host;
using test::randn;
using HVec = std::vector<uint16_t>;

Tensor half_view(const HVec& v, DType dtype) {
  return view_of(v.data(), dtype, Shape{int64_t(v.size())});
}

float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// The message of the tessera::Error fn raises ("" and a test failure when none).
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a tessera::Error";
  return "";
}

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

// ---- dispatch --------------------------------------------------------------------------------

TEST(KernelDispatch, TensorsOfOneCallMustShareASpace) {
  FVec x(8, 1.0f), y(8);
  Tensor dev = host(y);
  dev.space = Space::cuda;
  const std::string msg = error_of([&] { copy(host(x), dev, 8); });
  expect_contains(msg, "kernels::copy");
  expect_contains(msg, "y is in cuda memory but x is in host");
}

TEST(KernelDispatch, UnsupportedDtypeNamesKernelAndDtype) {
  HVec h(16);
  FVec y(16);
  std::string msg = error_of([&] { add_inplace(host(y), half_view(h, DType::bf16), 16); });
  expect_contains(msg, "kernels::add_inplace: x is bf16, this kernel takes f32");
  std::vector<int32_t> ids(4);
  msg = error_of([&] { gelu_forward(host(ids), host(y), 4); });
  expect_contains(msg, "kernels::gelu_forward: x is i32");
  // Token ids must be i32.
  FVec table(12), out(12), fids(4);
  msg = error_of([&] { embedding_forward(host(fids), host(table), host(out), 4, 3); });
  expect_contains(msg, "kernels::embedding_forward: ids is f32, this kernel takes i32");
  // A GEMM's operands share one dtype: an error, not a conversion.
  HVec a(4);
  FVec b(4), c(4);
  msg = error_of([&] {
    matmul(half_view(a, DType::bf16), host(b), host(c), 2, 2, 2, false, false);
  });
  expect_contains(msg, "kernels::matmul: B is f32, this kernel takes bf16");
  msg = error_of([&] { cast(host(y), host(ids), 4); });
  expect_contains(msg, "no conversion from f32 to i32");
}

TEST(KernelDispatch, TensorsMustHoldWhatTheSizesNeed) {
  FVec x(10), y(10);
  const std::string msg = error_of([&] { copy(host(x), host(y), 11); });
  expect_contains(msg, "kernels::copy: x [10] holds 10 elements, the sizes need 11");
  expect_contains(error_of([&] { fill(Tensor{}, 0.0f, 3); }), "x has no data");
  // Nothing to do, nothing to check.
  EXPECT_NO_THROW(fill(Tensor{}, 0.0f, 0));
}

TEST(KernelDispatch, CudaSpaceWithoutBackendOrDeviceIsAnError) {
  // Here the build may have the CUDA backend but there is no device, or it has none at all;
  // either way a cuda tensor is refused before any kernel runs. (On a GPU machine the tensor
  // is host memory labelled cuda, so the test does not run there.)
#ifdef TESSERA_CUDA
  if (cuda::device_count() > 0) GTEST_SKIP() << "a CUDA device is visible";
#endif
  FVec x(4);
  Tensor dev = host(x);
  dev.space = Space::cuda;
  const std::string msg = error_of([&] { fill(dev, 1.0f, 4); });
  expect_contains(msg, "kernels::fill: the tensors are in cuda memory but");
  EXPECT_EQ(x[0], 0.0f);
}

TEST(KernelDispatch, HostCallsRunTheCpuKernels) {
  const FVec a = randn(64, 1);
  FVec b(64);
  copy(host(a), host(b), 64);
  EXPECT_EQ(a, b);
}

// ---- casts -----------------------------------------------------------------------------------

TEST(CastKernels, Bf16RoundsToNearestEven) {
  const float one = 1.0f, ulp = std::ldexp(1.0f, -7);  // bf16 keeps 7 mantissa bits
  const FVec x = {one,
                  one + ulp / 2,               // tie, even below
                  one + 3 * ulp / 2,           // tie, even above
                  one + ulp / 2 + ulp / 1024,  // just above the tie
                  -2.5f,
                  0.0f,
                  -0.0f,
                  std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::max(),  // rounds up to infinity
                  std::numeric_limits<float>::quiet_NaN()};
  HVec y(x.size());
  cast(host(x), half_view(y, DType::bf16), int64_t(x.size()));
  EXPECT_EQ(y[0], 0x3f80);
  EXPECT_EQ(y[1], 0x3f80);
  EXPECT_EQ(y[2], 0x3f82);
  EXPECT_EQ(y[3], 0x3f81);
  EXPECT_EQ(y[4], 0xc020);
  EXPECT_EQ(y[5], 0x0000);
  EXPECT_EQ(y[6], 0x8000);
  EXPECT_EQ(y[7], 0x7f80);
  EXPECT_EQ(y[8], 0x7f80);
  EXPECT_EQ(y[9] & 0x7f80, 0x7f80);
  EXPECT_NE(y[9] & 0x007f, 0);  // still a NaN
}

TEST(CastKernels, F16RoundsToNearestEven) {
  const float one = 1.0f, ulp = std::ldexp(1.0f, -10), sub = std::ldexp(1.0f, -24);
  const FVec x = {one,
                  one + ulp / 2,
                  one + 3 * ulp / 2,
                  -2.0f,
                  65504.0f,
                  65519.0f,
                  65520.0f,
                  1e6f,
                  sub,
                  sub / 2,
                  3 * sub / 2,
                  sub / 4,
                  std::ldexp(1.0f, -14),
                  0.1f,
                  std::numeric_limits<float>::quiet_NaN(),
                  -std::numeric_limits<float>::infinity()};
  HVec y(x.size());
  cast(host(x), half_view(y, DType::f16), int64_t(x.size()));
  const HVec want = {0x3c00, 0x3c00, 0x3c02, 0xc000, 0x7bff, 0x7bff, 0x7c00,
                     0x7c00, 0x0001, 0x0000, 0x0002, 0x0000, 0x0400, 0x2e66};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(y[i], want[i]) << "x = " << x[i];
  EXPECT_EQ(y[14] & 0x7c00, 0x7c00);
  EXPECT_NE(y[14] & 0x03ff, 0);
  EXPECT_EQ(y[15], 0xfc00);
}

// Every finite 16-bit pattern converts to f32 exactly and back to itself.
TEST(CastKernels, HalfPatternsRoundTrip) {
  for (DType t : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(t));
    HVec all(65536), back(65536);
    for (uint32_t i = 0; i < 65536; ++i) all[i] = uint16_t(i);
    FVec f(65536);
    cast(half_view(all, t), host(f), 65536);
    cast(host(f), half_view(back, t), 65536);
    int failures = 0;
    for (uint32_t i = 0; i < 65536; ++i) {
      if (std::isnan(f[i])) continue;
      if (back[i] != all[i] && ++failures < 5) ADD_FAILURE() << std::hex << i << " -> " << back[i];
    }
    EXPECT_EQ(failures, 0);
  }
  // bf16 is the top half of the f32 pattern; f16 1.5 and the largest subnormal.
  HVec h = {0x3fc0};
  FVec f(1);
  cast(half_view(h, DType::bf16), host(f), 1);
  EXPECT_EQ(f[0], 1.5f);
  h = {0x3e00};
  cast(half_view(h, DType::f16), host(f), 1);
  EXPECT_EQ(f[0], 1.5f);
  h = {0x03ff};
  cast(half_view(h, DType::f16), host(f), 1);
  EXPECT_EQ(f[0], from_bits(0x387fc000));
}

TEST(CastKernels, F32ToF32IsACopy) {
  const FVec x = randn(33, 5);
  FVec y(33);
  cast(host(x), host(y), 33);
  EXPECT_EQ(x, y);
}

// ---- ParamStore compute copy -----------------------------------------------------------------

TEST(ParamCompute, F32AliasesTheMasterValues) {
  Allocator alloc;
  ParamStore store;
  Param& p = store.add("w", Shape{3, 5}, {ParamInit::normal, 0.1f}, true);
  store.finalize(alloc);
  EXPECT_EQ(store.compute_dtype(), DType::f32);
  EXPECT_EQ(p.compute.data, p.value.data);
  EXPECT_EQ(p.compute.dtype, DType::f32);
  EXPECT_EQ(p.compute.shape, p.value.shape);
  const size_t params = alloc.live(Charge::params);
  store.refresh_compute();  // nothing to do
  EXPECT_EQ(alloc.live(Charge::params), params);
  EXPECT_EQ(params, size_t(store.numel()) * 4);
}

TEST(ParamCompute, Bf16CopyIsChargedAndRefreshed) {
  for (DType t : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(t));
    Allocator alloc;
    ParamStore store;
    Param& a = store.add("a", Shape{7}, {ParamInit::normal, 0.5f}, true);
    Param& b = store.add("b", Shape{4, 3}, {ParamInit::normal, 0.5f}, true);
    store.finalize(alloc, {}, t);
    EXPECT_EQ(alloc.live(Charge::params), size_t(store.numel()) * (4 + 2));
    EXPECT_EQ(b.compute.dtype, t);
    EXPECT_EQ(b.compute.shape, b.local);
    EXPECT_NE(b.compute.data, b.value.data);
    store.initialize(42);
    store.refresh_compute();
    for (Param* p : {&a, &b}) {
      const int64_t n = p->local.numel();
      FVec got(static_cast<size_t>(n));
      HVec rounded(static_cast<size_t>(n));
      cast(p->value, half_view(rounded, t), n);  // the same kernel, on the parameter alone
      const auto* c = static_cast<const uint16_t*>(p->compute.data);
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(c[i], rounded[size_t(i)]) << p->name << i;
      cast(p->compute, host(got), n);
      for (int64_t i = 0; i < n; ++i)
        EXPECT_NEAR(got[size_t(i)], p->value.f32()[i],
                    std::abs(p->value.f32()[i]) * (t == DType::bf16 ? 1.0 / 256 : 1.0 / 2048));
    }
  }
}

TEST(ParamCompute, WithoutValuesTheViewsAreNullAndAnIntegerTypeIsRejected) {
  Allocator alloc;
  ParamStore s1, s2;
  s1.add("w", Shape{4}, {}, true);
  s2.add("w", Shape{4}, {}, true);
  StoreLayout no_values;
  no_values.values = false;
  s1.finalize(alloc, no_values, DType::bf16);  // ZeRO-3: the owner points the views
  const Param& p = *s1.params()[0];
  EXPECT_EQ(p.compute.data, nullptr);
  EXPECT_EQ(p.compute.dtype, DType::bf16);
  EXPECT_EQ(alloc.live(Charge::params), 0u);
  EXPECT_THROW(s2.finalize(alloc, {}, DType::i32), std::logic_error);
}

// ---- 16-bit GEMM -----------------------------------------------------------------------------

// bf16 and f16 operands with fp32 accumulation: the result is the exact product of the rounded
// operands up to fp32 summation error, for every transpose, alpha and beta, into f32 (and bf16).
TEST(HalfMatmul, ExactProductsOfRoundedOperandsAccumulatedInFp32) {
  uint32_t seed = 40;
  for (DType t : {DType::bf16, DType::f16})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (auto [M, N, K, alpha, beta] : {std::tuple{7L, 5L, 9L, 1.0f, 0.0f},
                                            std::tuple{33L, 17L, 70L, 0.5f, 1.0f},
                                            std::tuple{4L, 64L, 128L, 1.0f, -0.5f}}) {
          SCOPED_TRACE(std::string(dtype_name(t)) + (ta ? " At" : " A") + (tb ? " Bt" : " B") +
                       " M" + std::to_string(M) + " K" + std::to_string(K));
          const FVec A = randn(M * K, seed += 3), B = randn(K * N, seed += 3);
          const FVec C0 = randn(M * N, seed += 3);
          HVec a(A.size()), b(B.size());
          cast(host(A), half_view(a, t), M * K);
          cast(host(B), half_view(b, t), K * N);
          FVec ar(A.size()), br(B.size()), C = C0;
          cast(half_view(a, t), host(ar), M * K);  // the operands as the GEMM sees them
          cast(half_view(b, t), host(br), K * N);
          matmul(half_view(a, t), half_view(b, t), host(C), M, N, K, ta, tb, alpha, beta);
          int bad = 0;
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
              double acc = 0, mag = 0;
              for (int64_t k = 0; k < K; ++k) {
                const double p = double(ta ? ar[k * M + i] : ar[i * K + k]) *
                                 double(tb ? br[j * K + k] : br[k * N + j]);
                acc += p, mag += std::abs(p);
              }
              const double want = alpha * acc + beta * C0[i * N + j];
              const double scale = std::abs(alpha) * mag + std::abs(beta * C0[i * N + j]);
              if (!(std::abs(C[i * N + j] - want) <= 1e-5 * scale + 1e-30) && bad++ < 3)
                ADD_FAILURE() << i << "," << j << ": " << C[i * N + j] << " vs " << want;
            }
        }
}

TEST(HalfMatmul, Bf16OutputIsTheRoundedFp32Result) {
  const int64_t M = 9, N = 11, K = 40;
  const FVec A = randn(M * K, 7), B = randn(K * N, 8);
  HVec a(A.size()), b(B.size()), c(size_t(M * N));
  cast(host(A), half_view(a, DType::bf16), M * K);
  cast(host(B), half_view(b, DType::bf16), K * N);
  FVec f(size_t(M * N));
  matmul(half_view(a, DType::bf16), half_view(b, DType::bf16), host(f), M, N, K, false, true);
  matmul(half_view(a, DType::bf16), half_view(b, DType::bf16), half_view(c, DType::bf16), M, N, K,
         false, true);
  FVec back(size_t(M * N));
  cast(half_view(c, DType::bf16), host(back), M * N);
  for (int64_t i = 0; i < M * N; ++i)  // within one bf16 ulp of the fp32 result
    EXPECT_NEAR(back[size_t(i)], f[size_t(i)], std::abs(f[size_t(i)]) * 0x1p-7 + 1e-6) << i;
}

// A long reduction with B stored [K, N] (the output head's input gradient over the vocabulary)
// may run through the space as its transpose C^T = B^T A^T (with AMX: kernels/cpu/gemm_dnnl.cpp):
// the same products summed in another order, so each element within fp32 summation error of the
// plain GEMM's, whichever form this CPU takes; with room for less than C, the plain GEMM.
TEST(HalfMatmul, LongReductionThroughTheSpaceIsThePlainProduct) {
  uint32_t seed = 190;
  const int64_t M = 48, N = 40, K = 2048;  // K >= 16 max(M, N)
  const FVec A = randn(M * K, seed += 3), B = randn(K * N, seed += 3);
  HVec a(A.size()), b(B.size());
  cast(host(A), half_view(a, DType::bf16), M * K);
  cast(host(B), half_view(b, DType::bf16), K * N);
  const Tensor av = half_view(a, DType::bf16), bv = half_view(b, DType::bf16);
  FVec plain(size_t(M * N)), through(size_t(M * N)), space(size_t(M * N)), small(size_t(M * N - 1));
  matmul(av, bv, host(plain), M, N, K, false, false);
  matmul_packed_b(av, bv, host(through), M, N, K, false, false, host(space));
  FVec wa(A.size()), wb(B.size());  // the bf16 operands, widened
  cast(av, host(wa), M * K);
  cast(bv, host(wb), K * N);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double sum = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(wa[size_t(m * K + k)]) * double(wb[size_t(k * N + n)]);
        sum += p, mag += std::abs(p);
      }
      const size_t i = size_t(m * N + n);
      ASSERT_NEAR(through[i], sum, 1e-6 * mag + 1e-30) << m << "," << n;
      ASSERT_NEAR(through[i], plain[i], 2e-6 * mag + 1e-30) << m << "," << n;
    }
  FVec fallback(size_t(M * N));
  EXPECT_FALSE(matmul_packed_b(av, bv, host(fallback), M, N, K, false, false, host(small)));
  EXPECT_EQ(std::memcmp(plain.data(), fallback.data(), plain.size() * 4), 0);
}

// The output head's GEMMs may pack B into memory the caller lends (kernels::matmul_packed_b):
// from 512 rows on (1024 with AMX), A not transposed, with room for the packed B, and then they give the bits of
// the plain GEMM, B stored either way, C f32 or bf16; with too little room, A transposed or few
// rows they are the plain GEMM.
TEST(HalfMatmul, PackedWeightsGiveThePlainBits) {
  uint32_t seed = 90;
  // 1024 rows: packed with AVX512-BF16 (from 512 rows) and with AMX (from 1024).
  const int64_t M = 1024, K = 96, N = 200;
  const FVec A = randn(M * K, seed += 3), B = randn(K * N, seed += 3);
  HVec a(A.size()), b(B.size());
  cast(host(A), half_view(a, DType::bf16), M * K);
  cast(host(B), half_view(b, DType::bf16), K * N);
  FVec space(size_t(K * N));  // 4 bytes an element: twice the bf16 B, room for its padding
  for (bool tb : {false, true})
    for (DType c_dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::string(tb ? "Bt" : "B") + " C " + dtype_name(c_dtype));
      FVec plain32(size_t(M * N)), packed32(size_t(M * N));
      HVec plain16(size_t(M * N)), packed16(size_t(M * N));
      const bool f32 = c_dtype == DType::f32;
      const Tensor plain = f32 ? host(plain32) : half_view(plain16, DType::bf16);
      const Tensor packed = f32 ? host(packed32) : half_view(packed16, DType::bf16);
      const Tensor av = half_view(a, DType::bf16), bv = half_view(b, DType::bf16);
      matmul(av, bv, plain, M, N, K, false, tb);
      // Packed wherever the bf16 GEMMs are oneDNN's matmul; below AVX-512, widened and plain.
      EXPECT_EQ(matmul_packed_b(av, bv, packed, M, N, K, false, tb, host(space)),
                cpu_bf16_matmul());
      EXPECT_EQ(f32 ? std::memcmp(plain32.data(), packed32.data(), plain32.size() * 4)
                    : std::memcmp(plain16.data(), packed16.data(), plain16.size() * 2),
                0);
      if (!f32) continue;
      // Where packing does not apply, the plain GEMM writes C all the same.
      FVec tiny(8), fewer(size_t((M / 4) * N)), fewer_plain(fewer.size());
      std::fill(packed32.begin(), packed32.end(), 0.0f);
      EXPECT_FALSE(matmul_packed_b(av, bv, packed, M, N, K, false, tb, host(tiny)));
      EXPECT_EQ(std::memcmp(plain32.data(), packed32.data(), plain32.size() * 4), 0);
      EXPECT_FALSE(matmul_packed_b(av, bv, host(fewer), M / 4, N, K, false, tb, host(space)));
      matmul(av, bv, host(fewer_plain), M / 4, N, K, false, tb);
      EXPECT_EQ(std::memcmp(fewer_plain.data(), fewer.data(), fewer.size() * 4), 0);
    }
}

}  // namespace
}  // namespace tessera::kernels
