// Wall-clock accumulators per phase of a step, for the closing timing table.
#pragma once

#include <array>
#include <chrono>

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

 private:
  using Clock = std::chrono::steady_clock;
  std::array<double, kPhaseCount> total_{};
  int running_ = -1;
  Clock::time_point since_;
};

}  // namespace tessera
