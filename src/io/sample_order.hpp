// The global sample order: a pseudo-random permutation of [0, n) that is a pure function of
// (seed, epoch), computed per index in O(1) memory (a keyed Feistel network with cycle
// walking), so any rank can find any global sample without materialising the permutation.
#pragma once

#include <cstdint>

namespace tessera {

class SampleOrder {
 public:
  SampleOrder(uint64_t n, uint64_t seed, uint64_t epoch);
  uint64_t operator()(uint64_t i) const;  // the sample at position i of this epoch
  uint64_t size() const { return n_; }

 private:
  uint64_t round(uint64_t half, int r) const;
  uint64_t n_;
  int half_bits_;
  uint64_t key_;
};

}  // namespace tessera
