// Internal to the CUDA backend: the few cuBLAS entry points tessera calls, loaded from the
// shared library at the first use (a CUDA device context), not linked. Linking libcublas puts
// its static initialisation (about half a second of CPU) into every process of a CUDA-enabled
// build, CPU runs and every MPI rank included (doc/cuda.md, "cuBLAS is loaded on first use").
#pragma once

#include <cublas_v2.h>

namespace tessera::kernels::cuda::detail {

struct CublasApi {
  decltype(&::cublasCreate_v2) create;
  decltype(&::cublasDestroy_v2) destroy;
  decltype(&::cublasSetStream_v2) set_stream;
  decltype(&::cublasSetMathMode) set_math_mode;
  decltype(&::cublasSetWorkspace_v2) set_workspace;
  decltype(&::cublasGemmEx_64) gemm_ex_64;
  decltype(&::cublasGetStatusName) status_name;
  decltype(&::cublasGetStatusString) status_string;
};

// Loads libcublas.so.<major of the headers> (then the library found at configure time) at the
// first call; a tessera::Error naming the library and dlerror() if it cannot.
const CublasApi& cublas();

}  // namespace tessera::kernels::cuda::detail
