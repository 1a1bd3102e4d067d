// Linear warmup then cosine decay to min_lr at the last step.
#pragma once

#include <cstdint>

namespace tessera {

struct LrSchedule {
  double lr = 3e-4, min_lr = 3e-5;
  int64_t warmup = 0, total = 1;

  // Learning rate of 1-based step s.
  double at(int64_t s) const;
};

}  // namespace tessera
