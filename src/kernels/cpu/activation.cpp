// SwiGLU (llama MLP) and tanh-approximated GELU (gpt2 MLP).
#include <cmath>

#include "kernels/kernels.hpp"

namespace tessera::kernels {

void swiglu_forward(const float* gate, const float* up, float* out, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void swiglu_backward(const float* dout, const float* gate, const float* up, float* dgate,
                     float* dup, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float sig = 1.0f / (1.0f + std::exp(-g));
    const float silu = g * sig;
    dup[i] = dout[i] * silu;
    dgate[i] = dout[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
  }
}

namespace {
constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;
}  // namespace

void gelu_forward(const float* x, float* y, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + std::tanh(kGeluS * (v + kGeluA * v * v * v)));
  }
}

void gelu_backward(const float* dy, const float* x, float* dx, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float t = std::tanh(kGeluS * (v + kGeluA * v * v * v));
    const float d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kGeluS * (1.0f + 3.0f * kGeluA * v * v);
    dx[i] = dy[i] * d;
  }
}

}  // namespace tessera::kernels
