// hardware.device: the backend a run computes on, checked on every rank before any work.
#pragma once

#include "comm/communicator.hpp"
#include "config/run_config.hpp"

namespace tessera {

// Returns when the ranks can compute on hardware.device; otherwise a collective Error on
// every rank of world saying what is missing (the CUDA backend in this build, a GPU on the
// lowest rank without one) or that the GPU training path does not exist yet.
void require_device(const RunConfig& run, Communicator& world);
// One warning from rank 0 when train.precision costs speed on this device instead of saving it
// (bf16 on a CPU without AVX512-BF16; fp16 on any CPU, whose GEMMs are widened to fp32).
void warn_precision_cost(const RunConfig& run, Communicator& world);

}  // namespace tessera
