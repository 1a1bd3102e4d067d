// AdamW with decoupled weight decay, step for step what torch.optim.AdamW computes.
#include <cmath>

#include "kernels/backend.hpp"

namespace tessera::kernels::cpu {

void adamw(float* p, const float* g, float* m, float* v, int64_t n, const AdamWArgs& a) {
  const double bc1 = 1.0 - std::pow(double(a.beta1), double(a.step));
  const double bc2 = 1.0 - std::pow(double(a.beta2), double(a.step));
  const float step_size = float(a.lr / bc1);
  const float inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  const float decay = 1.0f - a.lr * a.weight_decay;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = a.grad_scale * g[i];
    m[i] = a.beta1 * m[i] + (1.0f - a.beta1) * gi;
    v[i] = a.beta2 * v[i] + (1.0f - a.beta2) * gi * gi;
    const float denom = std::sqrt(v[i]) * inv_sqrt_bc2 + a.eps;
    p[i] = p[i] * decay - step_size * m[i] / denom;
  }
}

void register_adamw(Backend& b) {
  b.adamw = adamw;
}

}  // namespace tessera::kernels::cpu
