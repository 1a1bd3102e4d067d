// tessera-prep's progress bar: bytes processed of the total, redrawn in place on stderr at
// most four times a second, and only when stderr is a terminal (logs and test output stay
// clean); the summary line at the end is printed either way, by the caller.
#pragma once

#include <chrono>
#include <cstdint>

namespace tessera {

class PrepProgress {
 public:
  explicit PrepProgress(uint64_t total_bytes);
  void update(uint64_t done_bytes);  // cheap: redraws only when due
  void finish();                     // clears the bar
  double seconds() const;            // since construction

 private:
  void draw(uint64_t done);
  using Clock = std::chrono::steady_clock;
  uint64_t total_;
  bool tty_;
  Clock::time_point start_, last_;
  bool drawn_ = false;
};

}  // namespace tessera
