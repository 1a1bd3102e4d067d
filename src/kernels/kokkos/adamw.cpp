// AdamW with decoupled weight decay, step for step what torch.optim.AdamW computes.
#include <cmath>

#include "kernels/kokkos/kokkos.hpp"

namespace tessera::kernels::kokkos {

template <class E>
struct AdamW {
  // compute: null, or the 16-bit compute copy of p (f16 or bf16), written in the same pass.
  static void adamw(float* p, const float* g, float* m, float* v, int64_t n, const AdamWArgs& a,
                    uint16_t* compute, bool f16) {
    if (!compute) return update(p, g, m, v, n, a, StoreNone{});
    if (f16) return update(p, g, m, v, n, a, StoreF16{compute});
    update(p, g, m, v, n, a, StoreBf16{compute});
  }

  template <class Copy>
  static void update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWArgs& a,
                     const Copy copy) {
    const double bc1 = 1.0 - std::pow(double(a.beta1), double(a.step));
    const double bc2 = 1.0 - std::pow(double(a.beta2), double(a.step));
    const float step_size = float(a.lr / bc1);
    const float inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
    const float decay = 1.0f - a.lr * a.weight_decay;
    const float beta1 = a.beta1, beta2 = a.beta2, eps = a.eps, grad_scale = a.grad_scale;
    for_each<E>(
        "adamw", n, TESSERA_LAMBDA(E, (int64_t i) {
          const float gi = grad_scale * g[i];
          const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
          const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
          m[i] = mi;
          v[i] = vi;
          const float denom = Kokkos::sqrt(vi) * inv_sqrt_bc2 + eps;
          const float pi = p[i] * decay - step_size * mi / denom;
          p[i] = pi;
          copy(i, pi);
        }));
  }

  static void fill(Backend& b) { b.adamw = adamw; }
};

void register_adamw(Backend& b, Target t) {
  register_for<AdamW>(b, t);
}

}  // namespace tessera::kernels::kokkos
