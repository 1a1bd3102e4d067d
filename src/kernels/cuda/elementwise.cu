// Elementwise kernels, bias add/backward, the fp64 sum of squares and the bf16/f16 casts.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/backend.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/context.hpp"
#include "kernels/cuda/reduce.cuh"

namespace tessera::kernels::cuda {
namespace {

using detail::grid_for;
using detail::stream;

constexpr int kThreads = 256;

#define TESSERA_GRID_STRIDE(i, n)                                           \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

__global__ void fill_kernel(float* x, float value, int64_t n) {
  TESSERA_GRID_STRIDE(i, n) x[i] = value;
}
__global__ void add_kernel(float* y, const float* x, int64_t n) {
  TESSERA_GRID_STRIDE(i, n) y[i] += x[i];
}
__global__ void scale_kernel(float* x, float alpha, int64_t n) {
  TESSERA_GRID_STRIDE(i, n) x[i] *= alpha;
}
__global__ void bias_add_kernel(float* y, const float* b, int64_t N, int64_t C) {
  TESSERA_GRID_STRIDE(i, N * C) y[i] += b[i % C];
}
__global__ void to_bf16_kernel(const float* x, uint16_t* y, int64_t n) {
  TESSERA_GRID_STRIDE(i, n) y[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
}
__global__ void to_f32_kernel(const uint16_t* x, float* y, int64_t n) {
  TESSERA_GRID_STRIDE(i, n) y[i] = __bfloat162float(__ushort_as_bfloat16(x[i]));
}
__global__ void to_f16_kernel(const float* x, uint16_t* y, int64_t n) {
  TESSERA_GRID_STRIDE(i, n) y[i] = __half_as_ushort(__float2half_rn(x[i]));
}
__global__ void f16_to_f32_kernel(const uint16_t* x, float* y, int64_t n) {
  TESSERA_GRID_STRIDE(i, n) y[i] = __half2float(__ushort_as_half(x[i]));
}

// Per-block sums of x^2 in double, then one block adds them in block order.
__global__ void sum_squares_partial_kernel(const float* x, int64_t n, double* partial) {
  __shared__ double shared[32];
  double s = 0;
  TESSERA_GRID_STRIDE(i, n) s += double(x[i]) * x[i];
  s = detail::block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
__global__ void sum_partials_kernel(const double* partial, int blocks, double* total,
                                    bool accumulate) {
  __shared__ double shared[32];
  double s = 0;
  for (int i = threadIdx.x; i < blocks; i += blockDim.x) s += partial[i];
  s = detail::block_sum(s, shared);
  if (threadIdx.x == 0) *total = accumulate ? *total + s : s;
}

// Queues *total = (or +=) sum x^2, with grid_for(n, kThreads) doubles of scratch in partial.
void sum_squares_into(const float* x, int64_t n, double* total, bool accumulate, double* partial) {
  const int blocks = grid_for(n, kThreads);
  sum_squares_partial_kernel<<<blocks, kThreads, 0, stream()>>>(x, n, partial);
  TESSERA_CUDA_LAUNCHED("sum_squares_partial_kernel");
  sum_partials_kernel<<<1, 1024, 0, stream()>>>(partial, blocks, total, accumulate);
  TESSERA_CUDA_LAUNCHED("sum_partials_kernel");
}

// dy summed over rows.
struct BiasTerm {
  const float* dy;
  int64_t C;
  __device__ void operator()(int64_t r, int64_t c, double* t) const { t[0] = dy[r * C + c]; }
};

}  // namespace

void fill(float* x, float value, int64_t n) {
  if (n <= 0) return;
  fill_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(x, value, n);
  TESSERA_CUDA_LAUNCHED("fill_kernel");
}

void copy(const float* x, float* y, int64_t n) {
  if (n <= 0) return;
  TESSERA_CUDA_CHECK(
      cudaMemcpyAsync(y, x, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, stream()));
}

void add_inplace(float* y, const float* x, int64_t n) {
  if (n <= 0) return;
  add_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(y, x, n);
  TESSERA_CUDA_LAUNCHED("add_kernel");
}

void scale_inplace(float* x, float alpha, int64_t n) {
  if (n <= 0) return;
  scale_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(x, alpha, n);
  TESSERA_CUDA_LAUNCHED("scale_kernel");
}

double sum_squares(const float* x, int64_t n) {
  if (n <= 0) return 0.0;
  const int blocks = grid_for(n, kThreads);
  double* scratch = static_cast<double*>(current().scratch(sizeof(double) * (blocks + 1)));
  sum_squares_into(x, n, scratch + blocks, false, scratch);
  double result = 0;
  TESSERA_CUDA_CHECK(
      cudaMemcpyAsync(&result, scratch + blocks, sizeof(double), cudaMemcpyDeviceToHost, stream()));
  current().synchronize();
  return result;
}

void sum_squares_accumulate(const float* x, int64_t n, double* total) {
  if (n <= 0) return;
  double* partial = static_cast<double*>(current().scratch(sizeof(double) * grid_for(n, kThreads)));
  sum_squares_into(x, n, total, true, partial);
}

void bias_add(float* y, const float* b, int64_t N, int64_t C) {
  if (N <= 0 || C <= 0) return;
  bias_add_kernel<<<grid_for(N * C, kThreads), kThreads, 0, stream()>>>(y, b, N, C);
  TESSERA_CUDA_LAUNCHED("bias_add_kernel");
}

void bias_backward(const float* dy, float* db, int64_t N, int64_t C) {
  detail::column_sums<1>(BiasTerm{dy, C}, N, C, detail::ColumnOut<1>{{db}});
}

void to_bf16(const float* x, uint16_t* y, int64_t n) {
  if (n <= 0) return;
  to_bf16_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(x, y, n);
  TESSERA_CUDA_LAUNCHED("to_bf16_kernel");
}

void to_f32(const uint16_t* x, float* y, int64_t n) {
  if (n <= 0) return;
  to_f32_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(x, y, n);
  TESSERA_CUDA_LAUNCHED("to_f32_kernel");
}

void to_f16(const float* x, uint16_t* y, int64_t n) {
  if (n <= 0) return;
  to_f16_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(x, y, n);
  TESSERA_CUDA_LAUNCHED("to_f16_kernel");
}

void f16_to_f32(const uint16_t* x, float* y, int64_t n) {
  if (n <= 0) return;
  f16_to_f32_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(x, y, n);
  TESSERA_CUDA_LAUNCHED("f16_to_f32_kernel");
}

void register_elementwise(Backend& b) {
  b.fill = fill;
  b.copy = copy;
  b.add_inplace = add_inplace;
  b.scale_inplace = scale_inplace;
  b.sum_squares = sum_squares;
  b.sum_squares_accumulate = sum_squares_accumulate;
  b.bias_backward = bias_backward;
  b.bias_add = bias_add;
  b.f32_to_bf16 = to_bf16;
  b.bf16_to_f32 = to_f32;
  b.f32_to_f16 = to_f16;
  b.f16_to_f32 = f16_to_f32;
}

}  // namespace tessera::kernels::cuda
