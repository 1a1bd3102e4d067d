// Internal to kernels/kokkos/: the activation functions per element, shared by the plain
// activation kernels (activation.cpp) and the fused MLP epilogues (epilogue.cpp), so both
// compute the same expressions and give the same bits.
#pragma once

#include "kernels/kokkos/kokkos.hpp"

namespace tessera::kernels::kokkos {

// gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), evaluated through
// 0.5 (1 + tanh(u)) = sigmoid(2u) =: s and 1 - tanh(u)^2 = 4 s (1 - s): gelu(x) = x s,
// gelu'(x) = s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 x^2); no cancellation for x << 0.
inline constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
inline constexpr float kGeluA = 0.044715f;

KOKKOS_INLINE_FUNCTION Sigmoid gelu_sigmoid(float v) {
  const float two_u = (2.0f * kGeluS) * (v + kGeluA * v * v * v);
  return sigmoid(two_u);
}
KOKKOS_INLINE_FUNCTION float gelu_value(float v) {
  return v * gelu_sigmoid(v).s;
}
KOKKOS_INLINE_FUNCTION float gelu_slope(float v) {
  const Sigmoid sig = gelu_sigmoid(v);
  return sig.s + (2.0f * kGeluS) * v * sig.s * sig.c * (1.0f + (3.0f * kGeluA) * v * v);
}

// silu(g) = g * s with s = sigmoid(g); silu'(g) = s * (1 + g * (1 - s)).
KOKKOS_INLINE_FUNCTION float swiglu_value(float g, float u) {
  return g * sigmoid(g).s * u;
}
struct SwigluGrad {
  float dgate, dup;
};
KOKKOS_INLINE_FUNCTION SwigluGrad swiglu_grad(float d, float g, float u) {
  const Sigmoid sig = sigmoid(g);
  return {d * u * sig.s * (1.0f + g * sig.c), d * (g * sig.s)};
}

}  // namespace tessera::kernels::kokkos
