#include "io/sample_order.hpp"

#include "core/rng.hpp"

namespace tessera {

SampleOrder::SampleOrder(uint64_t n, uint64_t seed, uint64_t epoch) : n_(n), half_bits_(1) {
  while ((uint64_t(1) << (2 * half_bits_)) < n) ++half_bits_;
  key_ = CounterRng(seed, "data.order").bits(epoch);
}

uint64_t SampleOrder::round(uint64_t half, int r) const {
  const Philox4x32 out = philox({uint32_t(half), uint32_t(half >> 32), uint32_t(r), 0u},
                                {uint32_t(key_), uint32_t(key_ >> 32)});
  return (uint64_t(out[0]) << 32 | out[1]) & ((uint64_t(1) << half_bits_) - 1);
}

uint64_t SampleOrder::operator()(uint64_t i) const {
  if (n_ <= 1) return 0;
  const uint64_t mask = (uint64_t(1) << half_bits_) - 1;
  uint64_t x = i;
  do {  // a bijection on [0, 4^half_bits); walk until the image falls inside [0, n)
    uint64_t left = x >> half_bits_, right = x & mask;
    for (int r = 0; r < 4; ++r) {
      const uint64_t next = left ^ round(right, r);
      left = right;
      right = next;
    }
    x = left << half_bits_ | right;
  } while (x >= n_);
  return x;
}

}  // namespace tessera
