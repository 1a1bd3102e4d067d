// SwiGLU (llama MLP) and tanh-approximated GELU (gpt2 MLP), through the branch-free
// exp_poly/sigmoid of kokkos.hpp; the per-element functions are activation.hpp's.
#include "kernels/kokkos/activation.hpp"

namespace tessera::kernels::kokkos {

template <class E>
struct Activation {
  static void swiglu_forward(const float* gate, const float* up, float* out, int64_t n) {
    Kokkos::parallel_for(
        "swiglu_forward", range<E>(n),
        TESSERA_LAMBDA(E, (int64_t i) { out[i] = swiglu_value(gate[i], up[i]); }));
  }

  static void swiglu_backward(const float* dout, const float* gate, const float* up, float* dgate,
                              float* dup, int64_t n) {
    Kokkos::parallel_for(
        "swiglu_backward", range<E>(n), TESSERA_LAMBDA(E, (int64_t i) {
          const SwigluGrad g = swiglu_grad(dout[i], gate[i], up[i]);
          dup[i] = g.dup;
          dgate[i] = g.dgate;
        }));
  }

  static void gelu_forward(const float* x, float* y, int64_t n) {
    Kokkos::parallel_for(
        "gelu_forward", range<E>(n), TESSERA_LAMBDA(E, (int64_t i) { y[i] = gelu_value(x[i]); }));
  }

  static void gelu_backward(const float* dy, const float* x, float* dx, int64_t n) {
    Kokkos::parallel_for(
        "gelu_backward", range<E>(n),
        TESSERA_LAMBDA(E, (int64_t i) { dx[i] = dy[i] * gelu_slope(x[i]); }));
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
