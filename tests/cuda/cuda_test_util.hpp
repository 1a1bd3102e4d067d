// Shared by the CUDA kernel tests: a fixture that skips without a GPU and otherwise makes a
// cuda::Context current, device copies of host vectors, and the error measures the tests use.
//
// Tolerances (fp32 unless stated):
//   * elementwise kernels: |gpu - cpu| <= 1e-5 |cpu| + 1e-5 max|cpu| per element (the second
//     term covers elements that cancel to near zero; same as the CPU unit tests);
//   * reductions, GEMM and attention: norm-wise ||gpu - cpu||_2 / ||cpu||_2 <= 1e-5, where an
//     element's error depends on the summation order and elementwise bounds are ill-posed;
//   * kernels documented as bitwise equal to the CPU (embedding, copies, bias add): exact.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "../test_vectors.hpp"
#include "kernels/cuda/context.hpp"
#include "kernels/kernels.hpp"

namespace tessera::kernels::test_cuda {

using tessera::test::FVec;
using tessera::test::host;
using tessera::test::randn;

constexpr double kRel = 1e-5;

// A device copy of a host vector, from the current context's pool (charged to activations). It
// converts to a 1-D Space::cuda Tensor of T's dtype; as() views it as another dtype of T's size
// (bf16 bit patterns held as uint16_t).
template <class T>
class Dev {
 public:
  explicit Dev(const std::vector<T>& host) : n_(host.size()) {
    p_ = static_cast<T*>(cuda::current().pool().allocate(bytes(), Charge::activations));
    EXPECT_EQ(cudaMemcpy(p_, host.data(), bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  explicit Dev(size_t n) : Dev(std::vector<T>(n)) {}
  ~Dev() { cuda::current().pool().release(p_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T* get() const { return p_; }
  Tensor as(DType dtype) const { return view_of(p_, dtype, Shape{int64_t(n_)}, Space::cuda); }
  operator Tensor() const {
    if constexpr (std::is_same_v<T, float>)
      return as(DType::f32);
    else if constexpr (std::is_same_v<T, double>)
      return as(DType::f64);
    else if constexpr (std::is_same_v<T, int32_t>)
      return as(DType::i32);
    else
      return as(DType::u16);
  }
  // Waits for the context's stream, then copies back.
  std::vector<T> host() const {
    cuda::current().synchronize();
    std::vector<T> h(n_);
    EXPECT_EQ(cudaMemcpy(h.data(), p_, bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }

 private:
  size_t bytes() const { return n_ * sizeof(T); }
  T* p_ = nullptr;
  size_t n_;
};

// TESSERA_REQUIRE_GPU=1 (bench/gpu-check sets it): a missing or unusable device fails the CUDA
// tests instead of skipping them, so a GPU check cannot pass with nothing run.
inline bool gpu_required() {
  const char* v = std::getenv("TESSERA_REQUIRE_GPU");
  return v && std::string(v) == "1";
}

// Skips (or, with TESSERA_REQUIRE_GPU=1, fails) the calling test when no CUDA device is visible.
#define TESSERA_NEED_CUDA_DEVICE()                                                       \
  do {                                                                                   \
    if (cuda::device_count() == 0) {                                                     \
      if (gpu_required()) FAIL() << "TESSERA_REQUIRE_GPU=1 but no usable CUDA device";   \
      GTEST_SKIP() << "no CUDA device: CUDA kernels not tested";                         \
    }                                                                                    \
  } while (0)

// Every test of the CUDA backend derives from this: skipped without a device, otherwise run with
// a fresh context current.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TESSERA_NEED_CUDA_DEVICE();
    ctx_ = std::make_unique<cuda::Context>(0);
    scope_ = std::make_unique<cuda::ContextScope>(*ctx_);
  }
  void TearDown() override {
    if (ctx_) ctx_->synchronize();
    scope_.reset();
    ctx_.reset();
  }
  cuda::Context& ctx() { return *ctx_; }

 private:
  std::unique_ptr<cuda::Context> ctx_;
  std::unique_ptr<cuda::ContextScope> scope_;
};

inline double max_abs(const FVec& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::abs(x)));
  return m;
}

// ||got - want||_2 / ||want||_2 (0 when both are zero).
inline double normwise_rel(const FVec& got, const FVec& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += double(want[i]) * want[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Elementwise: |got - want| <= rtol (|want| + max|want|); reports the first few failures.
inline void expect_close(const FVec& got, const FVec& want, double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double atol = rtol * max_abs(want);
  int reported = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::abs(double(got[i]) - want[i]);
    if (!(err <= rtol * std::abs(want[i]) + atol)) {
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", CPU " << want[i] << " (error "
                    << err << ")";
      if (++reported == 5) return;
    }
  }
}

inline void expect_normwise(const FVec& got, const FVec& want, double tol,
                            const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_TRUE(std::isfinite(got[i])) << what << "[" << i << "] = " << got[i];
  EXPECT_LE(normwise_rel(got, want), tol) << what;
}

inline void expect_bitwise(const FVec& got, const FVec& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int reported = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (!(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i])))) {
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", CPU " << want[i];
      if (++reported == 5) return;
    }
}

}  // namespace tessera::kernels::test_cuda
