#include "optim/lr_schedule.hpp"

#include <algorithm>
#include <cmath>

namespace tessera {

double LrSchedule::at(int64_t s) const {
  if (s <= warmup) return lr * double(s) / double(warmup);
  const double progress =
      std::min(1.0, double(s - warmup) / double(std::max<int64_t>(1, total - warmup)));
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace tessera
