// Embedding lookup and its backward. The backward must add several rows of dout into the same
// table row when a token repeats; instead of floating-point atomics (whose order, and so whose
// rounding, changes from run to run) the token ids are sorted with their positions (CUB's
// radix sort, which is stable), and one block per distinct id adds its rows in position order:
// the same additions in the same order as cpu/embedding.cpp, so the results agree bitwise.
#include <cuda_runtime.h>

#include <climits>
#include <cub/device/device_radix_sort.cuh>

#include "kernels/backend.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/context.hpp"

namespace tessera::kernels::cuda {
namespace {

using detail::stream;

constexpr int kThreads = 128;

int row_blocks(int64_t N) {
  return int(std::min<int64_t>(N, int64_t(current().sm_count()) * 64));
}

// out[n] = table[ids[n] - v0] when that row is in [0, rows), else 0.
__global__ void embedding_forward_kernel(const int32_t* ids, const float* table, float* out,
                                         int64_t N, int64_t C, int64_t v0, int64_t rows) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const int64_t r = int64_t(ids[n]) - v0;
    float* dst = out + n * C;
    const bool inside = r >= 0 && r < rows;
    const float* src = table + (inside ? r : 0) * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dst[c] = inside ? src[c] : 0.0f;
  }
}

// Sort keys: the table row, or `rows` (sorted last, then skipped) for ids outside the range.
__global__ void embedding_keys_kernel(const int32_t* ids, int32_t* keys, int32_t* positions,
                                      int64_t N, int64_t v0, int64_t rows) {
  for (int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; n < N;
       n += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = int64_t(ids[n]) - v0;
    keys[n] = int32_t(r >= 0 && r < rows ? r : rows);
    positions[n] = int32_t(n);
  }
}

// One block per run of equal sorted keys: dtable[key] += dout rows of the run, in order.
__global__ void embedding_accumulate_kernel(const int32_t* keys, const int32_t* positions,
                                            const float* dout, float* dtable, int64_t N, int64_t C,
                                            int64_t rows) {
  for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
    const int32_t key = keys[i];
    if (key >= rows || (i > 0 && keys[i - 1] == key)) continue;  // skipped, or not a run start
    float* dst = dtable + int64_t(key) * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      float acc = dst[c];
      for (int64_t j = i; j < N && keys[j] == key; ++j) acc += dout[int64_t(positions[j]) * C + c];
      dst[c] = acc;
    }
  }
}

void forward(const int32_t* ids, const float* table, float* out, int64_t N, int64_t C, int64_t v0,
             int64_t rows) {
  if (N <= 0 || C <= 0) return;
  embedding_forward_kernel<<<row_blocks(N), kThreads, 0, stream()>>>(ids, table, out, N, C, v0,
                                                                     rows);
  TESSERA_CUDA_LAUNCHED("embedding_forward_kernel");
}

void backward(const int32_t* ids, const float* dout, float* dtable, int64_t N, int64_t C,
              int64_t v0, int64_t rows) {
  if (N <= 0 || C <= 0) return;
  TESSERA_REQUIRE_LOCAL(N < INT_MAX && rows < INT_MAX, "embedding_backward: ", N, " tokens or ",
                        rows, " rows do not fit the 32-bit sort keys");
  // Only the bits a key can have are sorted.
  int end_bit = 1;
  while (end_bit < 31 && (int64_t(1) << end_bit) <= rows) ++end_bit;
  const int n = int(N);
  size_t temp_bytes = 0;
  TESSERA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, temp_bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n, 0, end_bit,
      stream()));
  const size_t keys_bytes = (sizeof(int32_t) * size_t(N) + 255) / 256 * 256;
  char* scratch = static_cast<char*>(current().scratch(4 * keys_bytes + temp_bytes));
  int32_t* keys_in = reinterpret_cast<int32_t*>(scratch);
  int32_t* pos_in = reinterpret_cast<int32_t*>(scratch + keys_bytes);
  int32_t* keys = reinterpret_cast<int32_t*>(scratch + 2 * keys_bytes);
  int32_t* pos = reinterpret_cast<int32_t*>(scratch + 3 * keys_bytes);
  void* temp = scratch + 4 * keys_bytes;

  embedding_keys_kernel<<<detail::grid_for(N, 256), 256, 0, stream()>>>(ids, keys_in, pos_in, N, v0,
                                                                        rows);
  TESSERA_CUDA_LAUNCHED("embedding_keys_kernel");
  TESSERA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys, pos_in, pos,
                                                     n, 0, end_bit, stream()));
  embedding_accumulate_kernel<<<row_blocks(N), kThreads, 0, stream()>>>(keys, pos, dout, dtable, N,
                                                                        C, rows);
  TESSERA_CUDA_LAUNCHED("embedding_accumulate_kernel");
}

}  // namespace

void embedding_forward(const int32_t* ids, const float* table, float* out, int64_t N, int64_t C) {
  forward(ids, table, out, N, C, 0, INT_MAX - 1);
}

void embedding_backward(const int32_t* ids, const float* dout, float* dtable, int64_t N,
                        int64_t C) {
  backward(ids, dout, dtable, N, C, 0, INT_MAX - 1);
}

void embedding_forward_range(const int32_t* ids, const float* table, float* out, int64_t N,
                             int64_t C, int64_t v0, int64_t rows) {
  forward(ids, table, out, N, C, v0, rows);
}

void embedding_backward_range(const int32_t* ids, const float* dout, float* dtable, int64_t N,
                              int64_t C, int64_t v0, int64_t rows) {
  backward(ids, dout, dtable, N, C, v0, rows);
}

void register_embedding(Backend& b) {
  b.embedding_forward = embedding_forward;
  b.embedding_backward = embedding_backward;
  b.embedding_forward_range = embedding_forward_range;
  b.embedding_backward_range = embedding_backward_range;
}

}  // namespace tessera::kernels::cuda
