// Kokkos's lifetime in a tessera process, and the execution space instances the kernels run on.
#include <omp.h>

#include <cstdlib>
#include <map>
#include <mutex>

#include "kernels/kokkos/kokkos.hpp"

#ifdef KOKKOS_ENABLE_CUDA
#include <cuda_runtime.h>

#define KOKKOS_IMPL_PUBLIC_INCLUDE  // the registry of spaces is Kokkos::Impl API
#include <impl/Kokkos_ExecSpaceManager.hpp>
#undef KOKKOS_IMPL_PUBLIC_INCLUDE

#include "kernels/cuda/context.hpp"
#endif

namespace tessera::kernels::kokkos {
namespace {

#ifdef KOKKOS_ENABLE_CUDA
// Kokkos initialises every space it was built with, and its CUDA space aborts where no device
// is visible; a CUDA build must still train on the CPU of such a machine (CI does). There the
// CUDA space's entry in Kokkos's registry of spaces is replaced by one that does nothing; the
// cuda table is never used without a device (kernels.cpp checks first). Kokkos::Impl API, as
// of 4.6: the registry key "150_Cuda" is Kokkos_Cuda_Instance.cpp's.
struct AbsentCuda : Kokkos::Impl::ExecSpaceBase {
  void initialize(const Kokkos::InitializationSettings&) override {}
  void finalize() override {}
  void static_fence(const std::string&) override {}
  void print_configuration(std::ostream& os, bool) override { os << "Cuda: no device\n"; }
};

// One Kokkos::Cuda instance per stream, made on first use, released before Kokkos finalises.
std::map<cudaStream_t, Device>& cuda_instances() {
  static std::map<cudaStream_t, Device> instances;
  return instances;
}
std::mutex cuda_instances_mutex;
#endif

void finalize_at_exit() {
#ifdef KOKKOS_ENABLE_CUDA
  cuda_instances().clear();
#endif
  if (Kokkos::is_initialized() && !Kokkos::is_finalized()) Kokkos::finalize();
}

}  // namespace

void ensure_initialized() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (Kokkos::is_initialized()) return;  // a test or benchmark main did it
    Kokkos::InitializationSettings settings;
    settings.set_num_threads(omp_get_max_threads());
    settings.set_disable_warnings(true);  // OMP_PROC_BIND advice, printed by every rank
#ifdef KOKKOS_ENABLE_CUDA
    if (cuda::device_count() == 0) {
      Kokkos::Impl::ExecSpaceManager::get_instance().register_space_factory(
          "150_Cuda", std::make_unique<AbsentCuda>());
    } else {
      int device = 0;
      cudaGetDevice(&device);
      settings.set_device_id(device);
    }
#endif
    Kokkos::initialize(settings);
    std::atexit(finalize_at_exit);
  });
}

#ifdef KOKKOS_ENABLE_CUDA
template <>
Device instance<Device>() {
  cudaStream_t stream = cuda::current().stream();
  std::lock_guard<std::mutex> lock(cuda_instances_mutex);
  auto& instances = cuda_instances();
  auto it = instances.find(stream);
  if (it == instances.end()) it = instances.emplace(stream, Device(stream)).first;
  return it->second;
}

template <>
double* scratch_scalar<Device>() {
  return static_cast<double*>(cuda::current().scratch(sizeof(double)));
}
#endif

void register_all(Backend& b, Target t) {
  ensure_initialized();
  register_elementwise(b, t);
  register_cast(b, t);
  register_norm(b, t);
  register_activation(b, t);
  register_epilogue(b, t);
  register_rope(b, t);
  register_embedding(b, t);
  register_cross_entropy(b, t);
  register_adamw(b, t);
  register_routing(b, t);
}

}  // namespace tessera::kernels::kokkos
