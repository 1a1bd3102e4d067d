#include "core/timer.hpp"

namespace tessera {

const char* phase_name(Phase p) {
  static const char* names[kPhaseCount] = {"data",      "forward",   "backward",
                                           "grad sync", "optimizer", "other"};
  return names[int(p)];
}

void PhaseTimer::enter(Phase p) {
  stop();
  running_ = int(p);
  since_ = Clock::now();
}

void PhaseTimer::stop() {
  if (running_ >= 0)
    total_[size_t(running_)] += std::chrono::duration<double>(Clock::now() - since_).count();
  running_ = -1;
}

double PhaseTimer::total() const {
  double s = 0;
  for (double x : total_) s += x;
  return s;
}

}  // namespace tessera
