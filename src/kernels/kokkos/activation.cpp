// SwiGLU (llama MLP) and tanh-approximated GELU (gpt2 MLP), through the branch-free
// exp_poly/sigmoid of kokkos.hpp.
#include "kernels/kokkos/kokkos.hpp"

namespace tessera::kernels::kokkos {
namespace {
constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;
}  // namespace

template <class E>
struct Activation {
  // silu(g) = g * s with s = sigmoid(g); silu'(g) = s * (1 + g * (1 - s)).
  static void swiglu_forward(const float* gate, const float* up, float* out, int64_t n) {
    Kokkos::parallel_for(
        "swiglu_forward", range<E>(n), KOKKOS_LAMBDA(int64_t i) {
          const float g = gate[i];
          out[i] = g * sigmoid(g).s * up[i];
        });
  }

  static void swiglu_backward(const float* dout, const float* gate, const float* up, float* dgate,
                              float* dup, int64_t n) {
    Kokkos::parallel_for(
        "swiglu_backward", range<E>(n), KOKKOS_LAMBDA(int64_t i) {
          const float g = gate[i], d = dout[i];
          const Sigmoid sig = sigmoid(g);
          const float u = up[i];
          dup[i] = d * (g * sig.s);
          dgate[i] = d * u * sig.s * (1.0f + g * sig.c);
        });
  }

  // gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), evaluated through
  // 0.5 (1 + tanh(u)) = sigmoid(2u) =: s and 1 - tanh(u)^2 = 4 s (1 - s): gelu(x) = x s,
  // gelu'(x) = s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 x^2); no cancellation for x << 0.
  static void gelu_forward(const float* x, float* y, int64_t n) {
    Kokkos::parallel_for(
        "gelu_forward", range<E>(n), KOKKOS_LAMBDA(int64_t i) {
          const float v = x[i];
          const float two_u = (2.0f * kGeluS) * (v + kGeluA * v * v * v);
          y[i] = v * sigmoid(two_u).s;
        });
  }

  static void gelu_backward(const float* dy, const float* x, float* dx, int64_t n) {
    Kokkos::parallel_for(
        "gelu_backward", range<E>(n), KOKKOS_LAMBDA(int64_t i) {
          const float v = x[i];
          const float two_u = (2.0f * kGeluS) * (v + kGeluA * v * v * v);
          const Sigmoid sig = sigmoid(two_u);
          const float d =
              sig.s + (2.0f * kGeluS) * v * sig.s * sig.c * (1.0f + (3.0f * kGeluA) * v * v);
          dx[i] = dy[i] * d;
        });
  }

  static void fill(Backend& b) {
    b.swiglu_forward = swiglu_forward;
    b.swiglu_backward = swiglu_backward;
    b.gelu_forward = gelu_forward;
    b.gelu_backward = gelu_backward;
  }
};

void register_activation(Backend& b, Target t) {
  register_for<Activation>(b, t);
}

}  // namespace tessera::kernels::kokkos
