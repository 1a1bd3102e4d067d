#include "train/device.hpp"

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "comm/agree.hpp"
#include "core/error.hpp"
#include "kernels/kernels.hpp"

namespace tessera {

int device_index(Communicator& world) {
  return world.node_group().rank();
}

void require_device(const RunConfig& run, Communicator& world) {
  const HardwareSection& hardware = run.hardware;
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
  // One rank per GPU: the ranks sharing a node take its devices by their order on the node
  // (device_index), modulo the devices each sees; two that would take the same physical GPU
  // (the same PCI bus id) stop the run. Each rank seeing its own GPU as device 0 (Slurm's
  // --gpu-bind=per_task:1) is fine.
  Communicator node = world.node_group();
  const int devices = kernels::cuda_device_count();
  const std::string id = kernels::cuda_device_id(device_index(world) % devices);
  std::vector<int64_t> keys(size_t(node.size()), 0);
  keys[size_t(node.rank())] = int64_t(std::hash<std::string>{}(id) >> 1) + 1;
  node.all_reduce(keys.data(), node.size());
  int shares = -1;
  for (int r = 0; r < node.rank() && shares < 0; ++r)
    if (keys[size_t(r)] == keys[size_t(node.rank())]) shares = r;
  agree_or_throw(world, shares < 0,
                 cat("hardware.device = cuda: ", node.size(), " ranks share the node of rank ",
                     world.rank(), " and ranks ", shares, " and ", node.rank(),
                     " of the node would both use GPU ", id, " (it sees ", devices,
                     " GPU(s)); tessera runs one rank per GPU (Slurm: --ntasks-per-node and "
                     "--gpus-per-task=1 or --gpu-bind=per_task:1, jobscripts/README.md)"));
  // Several ranks on GPUs reduce through NCCL (doc/cuda.md, "Device collectives"). The
  // emulated GPU of the tests keeps device memory on the host, where MPI reads it.
#ifndef TESSERA_NCCL
  TESSERA_REQUIRE(world.size() == 1 || kernels::cuda_emulated() > 0,
                  "hardware.device = cuda on ", world.size(), " ranks needs NCCL, which this "
                  "build lacks (install libnccl-dev and reconfigure with TESSERA_NCCL=ON); run "
                  "one rank, or set hardware.device = cpu");
#endif
  TESSERA_REQUIRE(run.model.experts == 0,
                  "hardware.device = cuda: mixtures of experts (model.experts = ",
                  run.model.experts, ") route tokens on the host so far; set hardware.device = "
                  "cpu");
}

void warn_precision_cost(const RunConfig& run, Communicator& world) {
  if (run.hardware.device != DeviceKind::cpu || world.rank() != 0) return;
  if (run.train.precision == TrainPrecision::bf16 && !kernels::cpu_native_bf16())
    std::printf("warning: train.precision = bf16 where oneDNN has no native bf16 GEMM (a CPU "
                "without AVX512-BF16, or ONEDNN_MAX_CPU_ISA below it): oneDNN emulates the bf16 "
                "GEMMs (without AVX-512, tessera widens their operands to fp32 for sgemm), "
                "typically slower than fp32; the results are the same. The report's MFU is against the measured bf16 GEMM rate, "
                "so compare tokens/s with an fp32 run to see the cost\n");
  if (run.train.precision == TrainPrecision::fp16)
    std::printf("warning: train.precision = fp16 on a CPU: the fp16 GEMM operands are widened "
                "to fp32 (exact), so this runs at fp32 speed or below; fp16 is for GPUs, and "
                "bf16 is the CPU's 16-bit format\n");
}

}  // namespace tessera
