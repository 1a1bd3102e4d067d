// What every public kernel function does before its backend's entry (kernels.cpp,
// routing.cpp): check each tensor argument (dtype, size, one space), pick the backend of that
// space, and refuse an entry the backend lacks. Internal to src/kernels.
#pragma once

#include <initializer_list>

#include "core/error.hpp"
#include "kernels/backend.hpp"
#include "kernels/kernels.hpp"

namespace tessera::kernels::detail {

// One tensor argument of a call: the elements the call's sizes make it read or write, and the
// dtype the kernel takes for it.
struct Arg {
  const char* name;
  const Tensor& t;
  int64_t need;
  DType dtype = DType::f32;
};

inline const Backend& backend_of(Space space, const char* kernel) {
  static const Backend& cpu = cpu_backend();
  if (space == Space::host) return cpu;
  static const bool emulated = cuda_emulated() > 0;
  if (emulated) return cpu;  // device memory is host memory under emulation
#ifdef TESSERA_CUDA
  static const bool has_device = cuda_device_count() > 0;
  TESSERA_REQUIRE_LOCAL(has_device, "kernels::", kernel,
                        ": the tensors are in cuda memory but no CUDA device is visible");
  static const Backend& gpu = cuda_backend();
  return gpu;
#else
  throw Error(cat("kernels::", kernel,
                  ": the tensors are in cuda memory but this build has no CUDA backend "
                  "(configure with the CUDA toolkit, TESSERA_CUDA=ON)"),
              __FILE__, __LINE__, false);
#endif
}

// Checks every argument (dtype, size, one space) and returns the backend of their space. An
// argument the call does not touch (need 0, no data) is skipped.
inline const Backend& check(const char* kernel, std::initializer_list<Arg> args) {
  const Arg* first = nullptr;
  for (const Arg& a : args) {
    if (a.need <= 0 && a.t.data == nullptr) continue;
    TESSERA_REQUIRE_LOCAL(a.t.dtype == a.dtype, "kernels::", kernel, ": ", a.name, " is ",
                          dtype_name(a.t.dtype), ", this kernel takes ", dtype_name(a.dtype),
                          " (convert with kernels::cast)");
    TESSERA_REQUIRE_LOCAL(a.t.data != nullptr, "kernels::", kernel, ": ", a.name,
                          " has no data but ", a.need, " elements are needed");
    TESSERA_REQUIRE_LOCAL(a.t.numel() >= a.need, "kernels::", kernel, ": ", a.name, " ",
                          a.t.shape.str(), " holds ", a.t.numel(), " elements, the sizes need ",
                          a.need);
    TESSERA_REQUIRE_LOCAL(a.t.space != Space::host || !in_emulated_device(a.t.data),
                          "kernels::", kernel, ": ", a.name,
                          " says host memory but is in (emulated) device "
                          "memory: a view lost its space (view_of without one?)");
    if (!first) first = &a;
    TESSERA_REQUIRE_LOCAL(a.t.space == first->t.space, "kernels::", kernel, ": ", a.name, " is in ",
                          space_name(a.t.space), " memory but ", first->name, " is in ",
                          space_name(first->t.space), " memory (copy between spaces explicitly)");
  }
  return backend_of(first ? first->t.space : Space::host, kernel);
}

template <class Fn>
Fn entry(const Backend& b, Fn fn, const char* kernel) {
  TESSERA_REQUIRE_LOCAL(fn != nullptr, "kernels::", kernel, " is not implemented by the ", b.name,
                        " backend");
  return fn;
}

#define TESSERA_KERNEL(b, name) entry(b, b.name, #name)

inline float* f(const Tensor& t) {
  return static_cast<float*>(t.data);
}
inline double* d(const Tensor& t) {
  return static_cast<double*>(t.data);
}
inline int32_t* i(const Tensor& t) {
  return static_cast<int32_t*>(t.data);
}
inline uint16_t* h(const Tensor& t) {
  return static_cast<uint16_t*>(t.data);
}


}  // namespace tessera::kernels::detail
