// Rotary position embedding, Llama's interleaved-pair convention.
#include <cmath>

#include "kernels/backend.hpp"

namespace tessera::kernels::cpu {

void rope(float* x, int64_t B, int64_t T, int64_t H, int64_t D, int64_t pos0, float theta,
          bool inverse) {
  const int64_t half = D / 2;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      float* row = x + (b * T + t) * H * D;
      const double pos = double(pos0 + t);
      for (int64_t j = 0; j < half; ++j) {
        const double angle = pos * std::pow(double(theta), -2.0 * double(j) / double(D));
        const float c = float(std::cos(angle));
        const float s = inverse ? -float(std::sin(angle)) : float(std::sin(angle));
        for (int64_t h = 0; h < H; ++h) {
          float* p = row + h * D + 2 * j;
          const float a = p[0], bb = p[1];
          p[0] = a * c - bb * s;
          p[1] = a * s + bb * c;
        }
      }
    }
  }
}

void register_rope(Backend& b) {
  b.rope = rope;
}

}  // namespace tessera::kernels::cpu
