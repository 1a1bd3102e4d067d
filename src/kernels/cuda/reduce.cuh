// Internal to the CUDA backend: block-wide reductions and the deterministic column sums used by
// bias_backward and the norm backwards. Every reduction has a fixed order (shuffle trees, then
// chunks in index order), so results do not change from run to run.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/check.hpp"

namespace tessera::kernels::cuda::detail {

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <class T>
__device__ __forceinline__ T warp_max(T v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `shared` holds 32 values; the call ends with a barrier, so it can be reused right after.
template <class T>
__device__ T block_sum(T v, T* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T total = lane < warps ? shared[lane] : T(0);
  total = warp_sum(total);
  __syncthreads();
  return total;
}

template <class T>
__device__ T block_max(T v, T* shared, T lowest) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T m = lane < warps ? shared[lane] : lowest;
  m = warp_max(m);
  __syncthreads();
  return m;
}

// ---- column sums ----------------------------------------------------------------------------
// out_k[c] += float(sum over rows r < N of term(r, c)[k]) for k < NOut, each sum in double over
// a fixed partition of the rows: blocks of 32 columns x 8 row lanes walk a chunk of rows, the
// chunks' partial sums go to scratch, and a second kernel adds them up in chunk order.

constexpr int kColTile = 32, kRowLanes = 8;

template <int NOut>
struct ColumnOut {
  float* out[NOut];
};

template <int NOut, class Term>
__global__ void column_partials_kernel(Term term, int64_t N, int64_t C, int64_t rows_per_chunk,
                                       double* partial) {
  __shared__ double acc_s[NOut][kRowLanes][kColTile];
  const int64_t c = int64_t(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t chunk = blockIdx.y, chunks = gridDim.y;
  const int64_t r0 = chunk * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
  double acc[NOut] = {};
  if (c < C)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      double t[NOut];
      term(r, c, t);
#pragma unroll
      for (int k = 0; k < NOut; ++k) acc[k] += t[k];
    }
#pragma unroll
  for (int k = 0; k < NOut; ++k) acc_s[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < C)
#pragma unroll
    for (int k = 0; k < NOut; ++k) {
      double s = 0;
      for (int y = 0; y < kRowLanes; ++y) s += acc_s[k][y][threadIdx.x];
      partial[(k * chunks + chunk) * C + c] = s;
    }
}

template <int NOut>
__global__ void column_finish_kernel(const double* partial, int64_t chunks, int64_t C,
                                     ColumnOut<NOut> out) {
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < C;
       c += int64_t(gridDim.x) * blockDim.x)
#pragma unroll
    for (int k = 0; k < NOut; ++k) {
      double s = 0;
      for (int64_t j = 0; j < chunks; ++j) s += partial[(k * chunks + j) * C + c];
      out.out[k][c] += float(s);
    }
}

template <int NOut, class Term>
void column_sums(Term term, int64_t N, int64_t C, ColumnOut<NOut> out) {
  if (N <= 0 || C <= 0) return;
  // Enough chunks to fill the device, each of at least 64 rows.
  const int64_t col_blocks = (C + kColTile - 1) / kColTile;
  const int64_t want = std::max<int64_t>(1, int64_t(current().sm_count()) * 8 / col_blocks);
  int64_t rows_per_chunk = std::max<int64_t>(64, (N + want - 1) / want);
  const int64_t chunks = (N + rows_per_chunk - 1) / rows_per_chunk;
  TESSERA_REQUIRE_LOCAL(chunks <= 65535 && col_blocks <= 2147483647, "column sums: ", N, " rows x ",
                        C, " columns is too large");
  double* partial = static_cast<double*>(current().scratch(sizeof(double) * NOut * chunks * C));
  column_partials_kernel<NOut>
      <<<dim3(unsigned(col_blocks), unsigned(chunks)), dim3(kColTile, kRowLanes), 0, stream()>>>(
          term, N, C, rows_per_chunk, partial);
  TESSERA_CUDA_LAUNCHED("column_partials_kernel");
  column_finish_kernel<NOut><<<grid_for(C, 256), 256, 0, stream()>>>(partial, chunks, C, out);
  TESSERA_CUDA_LAUNCHED("column_finish_kernel");
}

}  // namespace tessera::kernels::cuda::detail
