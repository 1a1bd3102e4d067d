// The CUDA backend of the kernel API. At this stage it holds the optimizer update; the rest
// of kernels.hpp follows, one file per kernel family, each tested against the CPU reference.
#pragma once

#include <cstdint>

#include "kernels/kernels.hpp"

namespace tessera::kernels::cuda {

// Number of visible CUDA devices (0 when there is no driver or no device).
int device_count();

// AdamW on device pointers; same arithmetic as kernels::adamw.
void adamw(float* p, const float* g, float* m, float* v, int64_t n, const AdamWArgs& a);

}  // namespace tessera::kernels::cuda
