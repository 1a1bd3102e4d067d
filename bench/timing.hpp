// Wall-clock timing shared by the host benchmarks of bench/.
#pragma once

#include <time.h>

#include <algorithm>
#include <vector>

namespace tessera::bench {

inline double now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

// The median wall time of fn() over reps runs, after 2 warm-ups.
template <class Fn>
double median_ms(int reps, Fn&& fn) {
  std::vector<double> t;
  for (int r = 0; r < reps + 2; ++r) {
    const double t0 = now_ms();
    fn();
    if (r >= 2) t.push_back(now_ms() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace tessera::bench
