#include "kernels/cuda/device_count.hpp"

#ifdef TESSERA_CUDA
#include "kernels/cuda/cuda_kernels.hpp"
#endif

namespace tessera::kernels {

bool cuda_backend_built() {
#ifdef TESSERA_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#ifdef TESSERA_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

}  // namespace tessera::kernels
