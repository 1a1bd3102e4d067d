// Float vectors with reproducible normal entries, shared by the unit and MPI tests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace tessera::test {

using FVec = std::vector<float>;

// n values from N(mean, stddev^2), the same for the same seed on every rank and run.
inline FVec randn(int64_t n, uint32_t seed, double stddev = 1.0, double mean = 0.0) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> dist(mean, stddev);
  FVec v(static_cast<size_t>(n));
  for (float& x : v) x = float(dist(gen));
  return v;
}

}  // namespace tessera::test
