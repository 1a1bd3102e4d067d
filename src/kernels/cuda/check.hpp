// Internal to the CUDA backend: CUDA and cuBLAS status codes turned into tessera::Error, and
// the small launch helpers the kernel files share. Device faults are local to a rank (raised
// with collective = false: the job is aborted, see core/error.hpp).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/error.hpp"
#include "kernels/cuda/context.hpp"
#include "kernels/cuda/cublas_api.hpp"

namespace tessera::kernels::cuda::detail {

inline void check_cuda(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so that the next launch check does not see it
  throw ::tessera::Error(
      cat("CUDA error in ", what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"),
      file, line, false);
}

inline void check_cublas(cublasStatus_t s, const char* what, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw ::tessera::Error(cat("cuBLAS error in ", what, ": ", cublas().status_name(s), " (",
                               cublas().status_string(s), ")"),
                           file, line, false);
}

// Grid size for a grid-stride loop over n elements with `threads` per block: enough blocks to
// fill the device several times over, no more.
inline int grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  const int64_t cap = int64_t(current().sm_count()) * 16;
  return int(std::max<int64_t>(1, std::min(blocks, cap)));
}

inline cudaStream_t stream() {
  return current().stream();
}

}  // namespace tessera::kernels::cuda::detail

#define TESSERA_CUDA_CHECK(expr) \
  ::tessera::kernels::cuda::detail::check_cuda((expr), #expr, __FILE__, __LINE__)
#define TESSERA_CUBLAS_CHECK(expr) \
  ::tessera::kernels::cuda::detail::check_cublas((expr), #expr, __FILE__, __LINE__)
// After a kernel launch: reports a bad configuration (the launch itself failing). Faults inside
// the kernel surface at the next synchronising call.
#define TESSERA_CUDA_LAUNCHED(name) \
  ::tessera::kernels::cuda::detail::check_cuda(cudaGetLastError(), name, __FILE__, __LINE__)
