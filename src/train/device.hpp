// hardware.device: the backend a run computes on, checked on every rank before any work.
#pragma once

#include "comm/communicator.hpp"
#include "config/run_config.hpp"

namespace tessera {

// Returns when the ranks can compute on hardware.device; otherwise a collective Error on
// every rank of world saying what is missing (the CUDA backend in this build, a GPU on the
// lowest rank without one) or that the GPU training path does not exist yet.
void require_device(const HardwareSection& hardware, Communicator& world);

}  // namespace tessera
