// SwiGLU (llama MLP) and tanh-approximated GELU (gpt2 MLP), vectorised with vec_math.hpp.
#include "kernels/backend.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace tessera::kernels::cpu {

using vec::Block;
using vec::vfloat;

// silu(g) = g * s with s = sigmoid(g); silu'(g) = s * (1 + g * (1 - s)).
void swiglu_forward(const float* gate, const float* up, float* out, int64_t n) {
  vec::for_each_block(n, [&](Block b) {
    const vfloat g = b.load(gate);
    b.store(out, g * vec::vsigmoid(g).s * b.load(up));
  });
}

void swiglu_backward(const float* dout, const float* gate, const float* up, float* dgate,
                     float* dup, int64_t n) {
  vec::for_each_block(n, [&](Block b) {
    const vfloat g = b.load(gate), d = b.load(dout);
    const vec::Sigmoid sig = vec::vsigmoid(g);
    b.store(dup, d * (g * sig.s));
    b.store(dgate, d * b.load(up) * sig.s * (1.0f + g * sig.c));
  });
}

// gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3). It is evaluated through
// the identities 0.5 (1 + tanh(u)) = sigmoid(2u) =: s and 1 - tanh(u)^2 = 4 s (1 - s):
//   gelu(x) = x s,   gelu'(x) = s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 x^2).
// vsigmoid gives s and 1 - s to fp32 relative accuracy, so unlike 1 + tanh(u) in fp32 there
// is no cancellation for x << 0.
namespace {
constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;
}  // namespace

void gelu_forward(const float* x, float* y, int64_t n) {
  vec::for_each_block(n, [&](Block b) {
    const vfloat v = b.load(x);
    const vfloat two_u = (2.0f * kGeluS) * (v + kGeluA * v * v * v);
    b.store(y, v * vec::vsigmoid(two_u).s);
  });
}

void gelu_backward(const float* dy, const float* x, float* dx, int64_t n) {
  vec::for_each_block(n, [&](Block b) {
    const vfloat v = b.load(x);
    const vfloat two_u = (2.0f * kGeluS) * (v + kGeluA * v * v * v);
    const vec::Sigmoid sig = vec::vsigmoid(two_u);
    const vfloat d = sig.s + (2.0f * kGeluS) * v * sig.s * sig.c * (1.0f + (3.0f * kGeluA) * v * v);
    b.store(dx, b.load(dy) * d);
  });
}

void register_activation(Backend& b) {
  b.swiglu_forward = swiglu_forward;
  b.swiglu_backward = swiglu_backward;
  b.gelu_forward = gelu_forward;
  b.gelu_backward = gelu_backward;
}

}  // namespace tessera::kernels::cpu
