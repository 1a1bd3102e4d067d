#include "model/transfers.hpp"

#include <chrono>

namespace tessera {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

StepTransfers::StepTransfers(OverlapTiming* timing) : timing_(timing), posted_(steady_seconds()) {}

void StepTransfers::poll() {
  if (done_ > 0 || reqs_.empty()) return;
  bool all = true;
  for (Request& r : reqs_) all = r.test() && all;
  if (all) done_ = steady_seconds();
}

void StepTransfers::finish() {
  if (reqs_.empty()) return;
  const double t0 = steady_seconds();
  for (Request& r : reqs_) r.wait();
  const double t1 = steady_seconds();
  for (OverlapTiming* t : {timing_, also_})
    if (t) {
      t->in_flight += (done_ > 0 ? done_ : t1) - posted_;
      t->exposed += t1 - t0;
      t->transfers += int64_t(reqs_.size());
    }
  reqs_.clear();
}

}  // namespace tessera
