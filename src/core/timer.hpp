// Wall-clock accumulators per phase of a step, for the closing timing table; with a Trace,
// each phase is also a span on the timeline.
#pragma once

#include <array>
#include <chrono>

#include "core/trace.hpp"

namespace tessera {

enum class Phase { data, forward, backward, grad_sync, optimizer, other };
constexpr int kPhaseCount = 6;
const char* phase_name(Phase p);

class PhaseTimer {
 public:
  // Starts timing phase p, stopping the phase that was running.
  void enter(Phase p);
  void stop();
  double seconds(Phase p) const { return total_[int(p)]; }
  double total() const;
  // Phases become spans of trace (null: none).
  void set_trace(Trace* trace) { trace_ = trace; }

 private:
  using Clock = std::chrono::steady_clock;
  std::array<double, kPhaseCount> total_{};
  int running_ = -1;
  Clock::time_point since_;
  Trace* trace_ = nullptr;
  double trace_since_ = 0;
  bool traced_ = false;  // the running phase began while the trace was recording
};

}  // namespace tessera
