// SwiGLU and tanh-approximated GELU, forward and backward, with the same formulas as
// cpu/activation.cpp: the sigmoid and its complement are both formed from exp(-|x|), so
// neither cancels, and GELU goes through 0.5 (1 + tanh(u)) = sigmoid(2u).
#include <cuda_runtime.h>

#include "kernels/backend.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/context.hpp"

namespace tessera::kernels::cuda {
namespace {

using detail::grid_for;
using detail::stream;

constexpr int kThreads = 256;
constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;

struct Sigmoid {
  float s, c;  // sigmoid(x) and 1 - sigmoid(x)
};
__device__ __forceinline__ Sigmoid sigmoid_pair(float x) {
  const float e = expf(-fabsf(x));
  const float big = 1.0f / (1.0f + e);  // sigmoid(|x|)
  const float small = e * big;          // sigmoid(-|x|)
  return x < 0.0f ? Sigmoid{small, big} : Sigmoid{big, small};
}

__global__ void swiglu_forward_kernel(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = g * sigmoid_pair(g).s * up[i];
  }
}

__global__ void swiglu_backward_kernel(const float* dout, const float* gate, const float* up,
                                       float* dgate, float* dup, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = gate[i], d = dout[i];
    const Sigmoid sig = sigmoid_pair(g);
    const float u = up[i];
    dup[i] = d * (g * sig.s);
    dgate[i] = d * u * sig.s * (1.0f + g * sig.c);
  }
}

__global__ void gelu_forward_kernel(const float* x, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    const float two_u = (2.0f * kGeluS) * (v + kGeluA * v * v * v);
    y[i] = v * sigmoid_pair(two_u).s;
  }
}

__global__ void gelu_backward_kernel(const float* dy, const float* x, float* dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    const float two_u = (2.0f * kGeluS) * (v + kGeluA * v * v * v);
    const Sigmoid sig = sigmoid_pair(two_u);
    const float d = sig.s + (2.0f * kGeluS) * v * sig.s * sig.c * (1.0f + (3.0f * kGeluA) * v * v);
    dx[i] = dy[i] * d;
  }
}

}  // namespace

void swiglu_forward(const float* gate, const float* up, float* out, int64_t n) {
  if (n <= 0) return;
  swiglu_forward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(gate, up, out, n);
  TESSERA_CUDA_LAUNCHED("swiglu_forward_kernel");
}

void swiglu_backward(const float* dout, const float* gate, const float* up, float* dgate,
                     float* dup, int64_t n) {
  if (n <= 0) return;
  swiglu_backward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(dout, gate, up, dgate,
                                                                           dup, n);
  TESSERA_CUDA_LAUNCHED("swiglu_backward_kernel");
}

void gelu_forward(const float* x, float* y, int64_t n) {
  if (n <= 0) return;
  gelu_forward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(x, y, n);
  TESSERA_CUDA_LAUNCHED("gelu_forward_kernel");
}

void gelu_backward(const float* dy, const float* x, float* dx, int64_t n) {
  if (n <= 0) return;
  gelu_backward_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(dy, x, dx, n);
  TESSERA_CUDA_LAUNCHED("gelu_backward_kernel");
}

void register_activation(Backend& b) {
  b.swiglu_forward = swiglu_forward;
  b.swiglu_backward = swiglu_backward;
  b.gelu_forward = gelu_forward;
  b.gelu_backward = gelu_backward;
}

}  // namespace tessera::kernels::cuda
