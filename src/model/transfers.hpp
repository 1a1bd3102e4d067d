// Non-blocking transfers behind compute: posted, polled while the compute runs (MPI progresses
// them only inside MPI calls), finished when their result is needed, with the time they were
// in flight and the time the finish waited added to an OverlapTiming (the summary's hidden
// fraction: 1 - exposed / in flight). The context-parallel ring's K/V blocks and the experts'
// all-to-alls use it; StepContext::in_flight makes every GEMM of the compute in between poll.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/process_grid.hpp"

namespace tessera {

class StepTransfers {
 public:
  explicit StepTransfers(OverlapTiming* timing);  // timing may be null
  // A second timing the transfers are also added to (a pair's per kind, model/pass_pair.hpp).
  void also(OverlapTiming* timing) { also_ = timing; }
  void add(Request r) { reqs_.push_back(std::move(r)); }
  bool empty() const { return reqs_.empty(); }
  int64_t size() const { return int64_t(reqs_.size()); }
  // Lets MPI progress the transfers; notes when they are all complete.
  void poll();
  // Waits for every transfer and adds to the timing.
  void finish();

 private:
  OverlapTiming* timing_;
  OverlapTiming* also_ = nullptr;
  double posted_, done_ = 0;
  std::vector<Request> reqs_;
};

// Seconds on a steady clock.
double steady_seconds();

}  // namespace tessera
