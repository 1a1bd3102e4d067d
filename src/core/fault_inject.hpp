// Test hooks (doc/testing.md): the environment variable TESSERA_FAULT_INJECT names one fault
// for a test to provoke (a signal at a moment, a checkpoint write killed halfway, a read that
// fails on one rank, a non-finite or spiking loss). Read here only.
#pragma once

#include <cstdint>
#include <string_view>

namespace tessera {

// Whether TESSERA_FAULT_INJECT names exactly `name`.
bool fault_injected(std::string_view name);
// Whether a fault "PREFIX-at-step-N" (step N only) or "PREFIX-from-step-N" (step N and
// after) fires at `step`.
bool fault_injected_at_step(std::string_view prefix, int64_t step);

}  // namespace tessera
