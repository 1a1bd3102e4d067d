// AdamW with decoupled weight decay on device pointers: the arithmetic of cpu/adamw.cpp.
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/backend.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/context.hpp"

namespace tessera::kernels::cuda {
namespace {

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n, float lr,
                             float beta1, float beta2, float eps, float decay, float step_size,
                             float inv_sqrt_bc2, float grad_scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = grad_scale * g[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
  }
}

}  // namespace

void adamw(float* p, const float* g, float* m, float* v, int64_t n, const AdamWArgs& a) {
  if (n <= 0) return;
  const double bc1 = 1.0 - std::pow(double(a.beta1), double(a.step));
  const double bc2 = 1.0 - std::pow(double(a.beta2), double(a.step));
  const int threads = 256;
  adamw_kernel<<<detail::grid_for(n, threads), threads, 0, detail::stream()>>>(
      p, g, m, v, n, a.lr, a.beta1, a.beta2, a.eps, 1.0f - a.lr * a.weight_decay, float(a.lr / bc1),
      float(1.0 / std::sqrt(bc2)), a.grad_scale);
  TESSERA_CUDA_LAUNCHED("adamw_kernel");
}

void register_adamw(Backend& b) {
  b.adamw = adamw;
}

}  // namespace tessera::kernels::cuda
