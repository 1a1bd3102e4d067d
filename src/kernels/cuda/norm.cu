// RMSNorm and LayerNorm, forward and backward: one block per row, the row statistics and the
// backward's row dot products in double, the weight/bias gradients as deterministic column
// sums in double (reduce.cuh). The expressions follow cpu/norm.cpp term by term.
#include <cuda_runtime.h>

#include "kernels/backend.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/context.hpp"
#include "kernels/cuda/reduce.cuh"

namespace tessera::kernels::cuda {
namespace {

using detail::block_sum;
using detail::stream;

constexpr int kThreads = 256;

int row_grid(int64_t N) {
  return int(std::min<int64_t>(N, int64_t(current().sm_count()) * 32));
}

__global__ void rmsnorm_forward_kernel(const float* x, const float* w, float* y, float* rstd,
                                       int64_t N, int64_t C, float eps) {
  __shared__ double shared[32];
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    double ss = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) ss += double(xr[c]) * xr[c];
    ss = block_sum(ss, shared);
    const float s = float(1.0 / sqrt(ss / double(C) + eps));
    if (threadIdx.x == 0) rstd[r] = s;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) yr[c] = xr[c] * s * w[c];
  }
}

__global__ void rmsnorm_backward_kernel(const float* dy, const float* x, const float* w,
                                        const float* rstd, float* dx, int64_t N, int64_t C) {
  __shared__ double shared[32];
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const float* xr = x + r * C;
    const float* dyr = dy + r * C;
    float* dxr = dx + r * C;
    const float s = rstd[r];
    double dot = 0;  // sum_c w_c dy_c x_c
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += double(w[c]) * dyr[c] * xr[c];
    dot = block_sum(dot, shared);
    const float k = float(dot * s * s * s / double(C));
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dxr[c] = s * w[c] * dyr[c] - k * xr[c];
  }
}

struct RmsWeightTerm {
  const float *dy, *x, *rstd;
  int64_t C;
  __device__ void operator()(int64_t r, int64_t c, double* t) const {
    t[0] = double(dy[r * C + c]) * x[r * C + c] * rstd[r];
  }
};

__global__ void layernorm_forward_kernel(const float* x, const float* w, const float* b, float* y,
                                         float* mean, float* rstd, int64_t N, int64_t C,
                                         float eps) {
  __shared__ double shared[32];
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    double m = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) m += xr[c];
    m = block_sum(m, shared) / double(C);
    double var = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) var += (xr[c] - m) * (xr[c] - m);
    var = block_sum(var, shared) / double(C);
    const float s = float(1.0 / sqrt(var + eps));
    const float mf = float(m);
    if (threadIdx.x == 0) {
      mean[r] = mf;
      rstd[r] = s;
    }
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) yr[c] = (xr[c] - mf) * s * w[c] + b[c];
  }
}

__global__ void layernorm_backward_kernel(const float* dy, const float* x, const float* w,
                                          const float* mean, const float* rstd, float* dx,
                                          int64_t N, int64_t C) {
  __shared__ double shared[32];
  for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    const float* xr = x + r * C;
    const float* dyr = dy + r * C;
    float* dxr = dx + r * C;
    const float m = mean[r], s = rstd[r];
    double sum_g = 0, sum_gx = 0;  // g = dy * w; sums of g and g * xhat
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const double xhat = (xr[c] - m) * s;
      const double g = double(dyr[c]) * w[c];
      sum_g += g;
      sum_gx += g * xhat;
    }
    sum_g = block_sum(sum_g, shared);
    sum_gx = block_sum(sum_gx, shared);
    const float mg = float(sum_g / double(C)), mgx = float(sum_gx / double(C));
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      const float xhat = (xr[c] - m) * s;
      dxr[c] = s * (dyr[c] * w[c] - mg - xhat * mgx);
    }
  }
}

// dw from dy * xhat and db from dy, summed over rows.
struct LayerNormParamTerm {
  const float *dy, *x, *mean, *rstd;
  int64_t C;
  __device__ void operator()(int64_t r, int64_t c, double* t) const {
    const float d = dy[r * C + c];
    const double xhat = (x[r * C + c] - mean[r]) * rstd[r];
    t[0] = d * xhat;
    t[1] = d;
  }
};

}  // namespace

void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t N, int64_t C,
                     float eps) {
  if (N <= 0) return;
  rmsnorm_forward_kernel<<<row_grid(N), kThreads, 0, stream()>>>(x, w, y, rstd, N, C, eps);
  TESSERA_CUDA_LAUNCHED("rmsnorm_forward_kernel");
}

void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, float* dx,
                      float* dw, int64_t N, int64_t C) {
  if (N <= 0) return;
  rmsnorm_backward_kernel<<<row_grid(N), kThreads, 0, stream()>>>(dy, x, w, rstd, dx, N, C);
  TESSERA_CUDA_LAUNCHED("rmsnorm_backward_kernel");
  detail::column_sums<1>(RmsWeightTerm{dy, x, rstd, C}, N, C, detail::ColumnOut<1>{{dw}});
}

void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean,
                       float* rstd, int64_t N, int64_t C, float eps) {
  if (N <= 0) return;
  layernorm_forward_kernel<<<row_grid(N), kThreads, 0, stream()>>>(x, w, b, y, mean, rstd, N, C,
                                                                   eps);
  TESSERA_CUDA_LAUNCHED("layernorm_forward_kernel");
}

void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean,
                        const float* rstd, float* dx, float* dw, float* db, int64_t N, int64_t C) {
  if (N <= 0) return;
  layernorm_backward_kernel<<<row_grid(N), kThreads, 0, stream()>>>(dy, x, w, mean, rstd, dx, N, C);
  TESSERA_CUDA_LAUNCHED("layernorm_backward_kernel");
  detail::column_sums<2>(LayerNormParamTerm{dy, x, mean, rstd, C}, N, C,
                         detail::ColumnOut<2>{{dw, db}});
}

void register_norm(Backend& b) {
  b.rmsnorm_forward = rmsnorm_forward;
  b.rmsnorm_backward = rmsnorm_backward;
  b.layernorm_forward = layernorm_forward;
  b.layernorm_backward = layernorm_backward;
}

}  // namespace tessera::kernels::cuda
