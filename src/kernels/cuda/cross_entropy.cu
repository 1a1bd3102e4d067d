// Softmax cross-entropy fused with its backward (the logits become the gradient), and the three
// passes of the vocabulary-parallel form. One block per row; the row maximum in float, the sum
// of exponentials in double, and every stored value formed with the same float operations as
// cpu/cross_entropy.cpp (exp, then the multiplication by grad_scale / sum).
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/backend.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/context.hpp"
#include "kernels/cuda/reduce.cuh"

namespace tessera::kernels::cuda {
namespace {

using detail::block_max;
using detail::block_sum;
using detail::stream;

constexpr int kThreads = 256;

int row_blocks(int64_t N) {
  return int(std::min<int64_t>(N, int64_t(current().sm_count()) * 16));
}

__device__ float row_max_of(const float* row, int64_t V_valid, float* shared) {
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < V_valid; v += blockDim.x) m = fmaxf(m, row[v]);
  return block_max(m, shared, -INFINITY);
}

__global__ void cross_entropy_fused_kernel(float* logits, const int32_t* targets, float* losses,
                                           int64_t N, int64_t V, int64_t V_valid,
                                           float grad_scale) {
  __shared__ float shared_f[32];
  __shared__ double shared_d[32];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    float* row = logits + n * V;
    const int32_t t = targets[n];
    const float mx = row_max_of(row, V_valid, shared_f);
    const float target_logit = row[t] - mx;
    double sum = 0;
    for (int64_t v = threadIdx.x; v < V_valid; v += blockDim.x) sum += expf(row[v] - mx);
    sum = block_sum(sum, shared_d);  // ends with a barrier: row[t] was read by everyone
    if (threadIdx.x == 0) losses[n] = float(log(sum) - double(target_logit));
    const float inv = float(grad_scale / sum);
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
      float g = v < V_valid ? expf(row[v] - mx) * inv : 0.0f;
      if (v == t) g -= grad_scale;
      row[v] = g;
    }
  }
}

__global__ void local_max_kernel(const float* logits, float* row_max, int64_t N, int64_t V,
                                 int64_t V_valid) {
  __shared__ float shared[32];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const float m = row_max_of(logits + n * V, V_valid, shared);
    if (threadIdx.x == 0) row_max[n] = m;  // -inf when this rank has no valid column
  }
}

__global__ void local_exp_kernel(float* logits, const int32_t* targets, const float* row_max,
                                 double* sum_exp, float* target_logit, int64_t N, int64_t V,
                                 int64_t V_valid, int64_t v0) {
  __shared__ double shared[32];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    float* row = logits + n * V;
    const float mx = row_max[n];
    const int64_t t = int64_t(targets[n]) - v0;
    if (threadIdx.x == 0) target_logit[n] = t >= 0 && t < V_valid ? row[t] - mx : 0.0f;
    __syncthreads();  // row[t] is read before it is overwritten
    double sum = 0;
    for (int64_t v = threadIdx.x; v < V_valid; v += blockDim.x) {
      const float e = expf(row[v] - mx);
      row[v] = e;
      sum += e;
    }
    sum = block_sum(sum, shared);
    if (threadIdx.x == 0) sum_exp[n] = V_valid > 0 ? sum : 0.0;
  }
}

__global__ void local_finish_kernel(float* logits, const int32_t* targets, const double* sum_exp,
                                    const float* target_logit, float* losses, int64_t N, int64_t V,
                                    int64_t V_valid, int64_t v0, float grad_scale) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    float* row = logits + n * V;
    if (threadIdx.x == 0) losses[n] = float(log(sum_exp[n]) - double(target_logit[n]));
    const float inv = float(grad_scale / sum_exp[n]);
    const int64_t t = int64_t(targets[n]) - v0;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
      float g = v < V_valid ? row[v] * inv : 0.0f;
      if (v == t && t < V_valid) g -= grad_scale;
      row[v] = g;
    }
  }
}

}  // namespace

void cross_entropy_fused(float* logits, const int32_t* targets, float* losses, int64_t N, int64_t V,
                         int64_t V_valid, float grad_scale) {
  if (N <= 0) return;
  cross_entropy_fused_kernel<<<row_blocks(N), kThreads, 0, stream()>>>(logits, targets, losses, N,
                                                                       V, V_valid, grad_scale);
  TESSERA_CUDA_LAUNCHED("cross_entropy_fused_kernel");
}

void cross_entropy_local_max(const float* logits, float* row_max, int64_t N, int64_t V,
                             int64_t V_valid) {
  if (N <= 0) return;
  local_max_kernel<<<row_blocks(N), kThreads, 0, stream()>>>(logits, row_max, N, V, V_valid);
  TESSERA_CUDA_LAUNCHED("local_max_kernel");
}

void cross_entropy_local_exp(float* logits, const int32_t* targets, const float* row_max,
                             double* sum_exp, float* target_logit, int64_t N, int64_t V,
                             int64_t V_valid, int64_t v0) {
  if (N <= 0) return;
  local_exp_kernel<<<row_blocks(N), kThreads, 0, stream()>>>(logits, targets, row_max, sum_exp,
                                                             target_logit, N, V, V_valid, v0);
  TESSERA_CUDA_LAUNCHED("local_exp_kernel");
}

void cross_entropy_local_finish(float* logits, const int32_t* targets, const double* sum_exp,
                                const float* target_logit, float* losses, int64_t N, int64_t V,
                                int64_t V_valid, int64_t v0, float grad_scale) {
  if (N <= 0) return;
  local_finish_kernel<<<row_blocks(N), kThreads, 0, stream()>>>(
      logits, targets, sum_exp, target_logit, losses, N, V, V_valid, v0, grad_scale);
  TESSERA_CUDA_LAUNCHED("local_finish_kernel");
}

void register_cross_entropy(Backend& b) {
  b.cross_entropy_fused = cross_entropy_fused;
  b.cross_entropy_local_max = cross_entropy_local_max;
  b.cross_entropy_local_exp = cross_entropy_local_exp;
  b.cross_entropy_local_finish = cross_entropy_local_finish;
}

}  // namespace tessera::kernels::cuda
