// hardware.device: the backend a run computes on, checked on every rank before any work.
#pragma once

#include "comm/communicator.hpp"
#include "config/run_config.hpp"

namespace tessera {

// Returns when the ranks can compute on hardware.device; otherwise a collective Error on
// every rank of world saying what is missing (the CUDA backend in this build, a GPU on the
// lowest rank without one, one GPU per rank, NCCL for several ranks) or what the GPU path
// does not cover (experts).
void require_device(const RunConfig& run, Communicator& world);
// The CUDA device a rank takes, before the modulo of the devices it sees: its index among the
// ranks of its node, in world order (collective).
int device_index(Communicator& world);
// One warning from rank 0 when train.precision costs speed on this device instead of saving it
// (bf16 where oneDNN has no native bf16 GEMM; fp16 on any CPU, whose GEMMs are widened to fp32).
void warn_precision_cost(const RunConfig& run, Communicator& world);

}  // namespace tessera
