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
  traced_ = trace_ && trace_->recording();
  if (traced_) trace_since_ = trace_->now();
}

void PhaseTimer::stop() {
  if (running_ >= 0) {
    total_[size_t(running_)] += std::chrono::duration<double>(Clock::now() - since_).count();
    if (traced_)
      trace_->add({phase_name(Phase(running_)), nullptr, trace_since_, trace_->now(), -1, -1, -1,
                   -1, -1, -1, TraceKind::phase});
  }
  running_ = -1;
  traced_ = false;
}

double PhaseTimer::total() const {
  double s = 0;
  for (double x : total_) s += x;
  return s;
}

}  // namespace tessera
