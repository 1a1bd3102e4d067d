#include "train/device.hpp"

#include "comm/agree.hpp"
#include "core/error.hpp"
#include "kernels/kernels.hpp"

namespace tessera {

void require_device(const HardwareSection& hardware, Communicator& world) {
  if (hardware.device == DeviceKind::cpu) return;
  // The same on every rank (one executable): no agreement needed.
  TESSERA_REQUIRE(kernels::cuda_backend_built(),
                  "hardware.device = cuda: this build has no CUDA backend (configure with "
                  "TESSERA_CUDA=ON), or set hardware.device = cpu");
  // Per rank: a node may have fewer GPUs than ranks, or none.
  const bool visible = kernels::cuda_device_count() > 0;
  agree_or_throw(world, visible,
                 cat("hardware.device = cuda: no CUDA device is visible to rank ", world.rank(),
                     "; check the node's GPUs, driver and CUDA_VISIBLE_DEVICES, or set "
                     "hardware.device = cpu"));
  TESSERA_REQUIRE(false,
                  "hardware.device = cuda: the GPU training path is not built yet (the "
                  "CUDA kernels are, doc/cuda.md); set hardware.device = cpu");
}

}  // namespace tessera
