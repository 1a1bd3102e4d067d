// The three CUDA driver functions Kokkos's CUDA space calls (it asks a stream for its context),
// resolved from libcuda.so.1 when first called instead of at load time. Linking the driver
// library directly would make every tessera executable of a CUDA build refuse to start on a
// machine without the NVIDIA driver, where it must still train on the CPU (the CUDA runtime
// itself loads the driver this way). Without a driver they return CUDA_ERROR_NO_DEVICE; Kokkos
// only reaches them after a device was found. Compiled only in CUDA builds
// (cmake/kokkos.cmake drops Kokkos's link to CUDA::cuda_driver).
#include <dlfcn.h>

namespace {

constexpr int kNoDevice = 100;  // CUDA_ERROR_NO_DEVICE

template <class Fn>
Fn driver_function(const char* name) {
  static void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  return lib ? reinterpret_cast<Fn>(dlsym(lib, name)) : nullptr;
}

}  // namespace

// The driver's signatures with its handle types spelled as what they are (CUresult is an enum,
// CUdevice an int, CUcontext and CUstream pointers), so that cuda.h's renaming macros stay out.
extern "C" {

int cuCtxGetDevice(int* device) {
  static const auto fn = driver_function<int (*)(int*)>("cuCtxGetDevice");
  return fn ? fn(device) : kNoDevice;
}

int cuCtxPushCurrent_v2(void* context) {
  static const auto fn = driver_function<int (*)(void*)>("cuCtxPushCurrent_v2");
  return fn ? fn(context) : kNoDevice;
}

int cuStreamGetCtx(void* stream, void** context) {
  static const auto fn = driver_function<int (*)(void*, void**)>("cuStreamGetCtx");
  return fn ? fn(stream, context) : kNoDevice;
}

}  // extern "C"
