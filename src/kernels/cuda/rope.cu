// Rotary position embedding (Llama's interleaved pairs), in place. One block per token: each
// thread takes pairs j, forms the angle (pos0 + t) theta^(-2j/D) and its cosine and sine in
// double as cpu/rope.cpp does (a float angle is off by ~1e-4 at position 4096), and rotates
// pair j of every head.
#include <cuda_runtime.h>

#include "kernels/backend.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/context.hpp"

namespace tessera::kernels::cuda {
namespace {

__global__ void rope_kernel(float* x, int64_t BT, int64_t T, int64_t H, int64_t D, int64_t pos0,
                            float theta, bool inverse) {
  const int64_t half = D / 2;
  for (int64_t bt = blockIdx.x; bt < BT; bt += gridDim.x) {
    float* row = x + bt * H * D;
    const double pos = double(pos0 + bt % T);
    for (int64_t j = threadIdx.x; j < half; j += blockDim.x) {
      const double angle = pos * pow(double(theta), -2.0 * double(j) / double(D));
      const float c = float(cos(angle));
      const float s = inverse ? -float(sin(angle)) : float(sin(angle));
      for (int64_t h = 0; h < H; ++h) {
        float* p = row + h * D + 2 * j;
        const float a = p[0], b = p[1];
        p[0] = a * c - b * s;
        p[1] = a * s + b * c;
      }
    }
  }
}

}  // namespace

void rope(float* x, int64_t B, int64_t T, int64_t H, int64_t D, int64_t pos0, float theta,
          bool inverse) {
  const int64_t BT = B * T;
  if (BT <= 0 || H <= 0 || D < 2) return;
  const int threads = int(std::min<int64_t>(128, (D / 2 + 31) / 32 * 32));
  const int blocks = int(std::min<int64_t>(BT, int64_t(current().sm_count()) * 32));
  rope_kernel<<<blocks, threads, 0, detail::stream()>>>(x, BT, T, H, D, pos0, theta, inverse);
  TESSERA_CUDA_LAUNCHED("rope_kernel");
}

void register_rope(Backend& b) {
  b.rope = rope;
}

}  // namespace tessera::kernels::cuda
