// Float vectors with reproducible normal entries, shared by the unit and MPI tests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "tensor/tensor.hpp"

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

// n values from a handful of levels, 0.125 apart: many exact ties (selection tests).
inline FVec tied(int64_t n, uint32_t seed, int levels) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> d(0, levels - 1);
  FVec v(static_cast<size_t>(n));
  for (float& x : v) x = 0.125f * float(d(gen));
  return v;
}

// A 1-D host tensor viewing a vector (float, double or int32_t), for kernel arguments.
template <class T>
Tensor host(const std::vector<T>& v) {
  return view_of(v.data(), Shape{int64_t(v.size())});
}

}  // namespace tessera::test
