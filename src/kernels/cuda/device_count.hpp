// Whether this build has the CUDA backend and how many GPUs this process sees. Compiles
// without the CUDA toolkit: with TESSERA_CUDA off there is no backend and no device.
#pragma once

namespace tessera::kernels {

// True when the build has the CUDA backend (configured with TESSERA_CUDA=ON).
bool cuda_backend_built();

// CUDA devices visible to this process; 0 without the backend, a driver or a device.
int cuda_device_count();

}  // namespace tessera::kernels
