// CUDA kernels against the CPU reference on the same inputs. Needs a GPU: without one every
// test is reported as skipped (label cuda), and the device checks run where one is lent.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cuda/cuda_kernels.hpp"

namespace tessera::kernels {
namespace {

struct DeviceBuffer {
  float* p = nullptr;
  explicit DeviceBuffer(const std::vector<float>& host) {
    EXPECT_EQ(cudaMalloc(&p, host.size() * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(p); }
  std::vector<float> get(size_t n) const {
    std::vector<float> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

TEST(CudaKernels, AdamWMatchesCpu) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t n = 100003;
  std::mt19937 gen(3);
  std::normal_distribution<float> normal;
  std::vector<float> p(n), g(n), m(n), v(n);
  for (int64_t i = 0; i < n; ++i)
    p[i] = normal(gen), g[i] = normal(gen), m[i] = 0.1f * normal(gen), v[i] = std::abs(normal(gen));
  DeviceBuffer dp(p), dg(g), dm(m), dv(v);
  const AdamWArgs args{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.5f};
  adamw(p.data(), g.data(), m.data(), v.data(), n, args);
  cuda::adamw(dp.p, dg.p, dm.p, dv.p, n, args);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> p_gpu = dp.get(size_t(n)), m_gpu = dm.get(size_t(n));
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    worst = std::max(worst, double(std::abs(p_gpu[i] - p[i])) / (std::abs(p[i]) + 1e-3));
    worst = std::max(worst, double(std::abs(m_gpu[i] - m[i])) / (std::abs(m[i]) + 1e-3));
  }
  EXPECT_LE(worst, 1e-5);
}

}  // namespace
}  // namespace tessera::kernels
