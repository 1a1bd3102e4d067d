// Counter-based random numbers (Philox-4x32-10, Salmon et al. 2011). A value is a pure
// function of (key, counter), so a tensor element's initial value depends only on
// (seed, parameter name, global element index) and never on how the tensor is sharded.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace tessera {

using Philox4x32 = std::array<uint32_t, 4>;

// Philox-4x32 with 10 rounds.
Philox4x32 philox(Philox4x32 counter, std::array<uint32_t, 2> key);

// 64-bit FNV-1a of a name: turns a parameter name into a stream key.
uint64_t hash_name(std::string_view name);

// The stream (seed, name): element i draws from counter (i / 2, 0, 0, 0) -- each Philox call
// yields two normals by Box-Muller, so elements 2j and 2j+1 share one call.
class CounterRng {
 public:
  CounterRng(uint64_t seed, std::string_view name);
  float normal(uint64_t index) const;    // N(0,1)
  // normal(2j) and normal(2j+1) from one Philox call: out[0], out[1].
  void normal_pair(uint64_t j, float* out) const;
  uint64_t bits(uint64_t index) const;   // 64 uniform bits
  double uniform(uint64_t index) const;  // [0,1)

 private:
  std::array<uint32_t, 2> key_;
};

}  // namespace tessera
