// Data-parallel gradient reduction in buckets, overlapped with backward.
//
// Gradients live in one flat buffer in parameter-registration (forward) order; backward
// finishes them in roughly the reverse order. Buckets are contiguous ranges of that buffer
// of about parallel.bucket_mb, formed from the last parameter backwards. During the final
// micro-batch's backward the model reports each layer's parameters as final (ready()); a
// bucket whose parameters are all final starts its all-reduce at once (non-blocking) while
// backward continues. MPI moves a non-blocking collective only inside MPI calls, so every
// ready() also polls the buckets in flight (progress = poll; progress = none never tests them
// before finish(), to measure what MPI does unpolled). Earlier micro-batches only accumulate:
// nothing is reduced until the last one.
//
// Each step records, per rank, how long the reduction was in flight and how long the step
// was held up by it (DpSyncTiming); doc/performance.md explains how to read them.
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "config/choices.hpp"  // DpProgress (parallel.progress)
#include "model/param.hpp"

namespace tessera {

// One step's data-parallel gradient all-reduce as one rank saw it (or a sum over steps).
struct DpSyncTiming {
  int64_t buckets = 0;   // all-reduces
  int64_t bytes = 0;     // gradient bytes reduced
  double in_flight = 0;  // seconds during which some bucket was posted and not yet seen
                         // complete (seen: by a test() in ready() or in finish())
  double exposed = 0;    // seconds in finish(): backward is over and the step waits
  double posting = 0;    // seconds in ready() starting all-reduces (MPI_Iallreduce)
  double polling = 0;    // seconds in ready() testing buckets in flight; both are on the
                         // critical path (MPI does copies and sums inside these calls)
  DpSyncTiming& operator+=(const DpSyncTiming& o);
};

class GradBuckets {
 public:
  // overlap = false reduces every bucket after backward (for comparison).
  // reduce = bf16 (parallel.grad_reduce_dtype) rounds each bucket into a bf16 staging buffer
  // (charged to alloc as communication buffers), all-reduces that and widens the sum back.
  // expert_dp: the group that reduces the gradients of the routed experts this rank holds
  // for its expert-parallel group only (Param::expert; the edp group); a bucket holds either
  // such experts or other parameters, never both.
  GradBuckets(ParamStore& store, Communicator& dp, double bucket_mb, bool overlap,
              DpProgress progress = DpProgress::poll, ReduceDtype reduce = ReduceDtype::fp32,
              Allocator* alloc = nullptr, Communicator* expert_dp = nullptr);
  DpProgress progress() const { return progress_; }
  bool overlap() const { return overlap_; }

  // Call before each micro-batch's backward; only the last one reduces.
  void arm(bool last_microbatch);
  // Parameters [first, last) of the store (registration indices) have final gradients.
  void ready(int first, int last);
  // Completes every reduction (starting any bucket not yet started).
  void finish();

  int buckets() const { return int(buckets_.size()); }
  // Buckets whose reduction had started before backward ended (last step).
  int started_early() const { return started_early_; }
  // The latest reduction (last micro-batch of the latest step) on this rank; zero until one ran.
  const DpSyncTiming& last_step() const { return last_; }

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;  // element range in the flat gradient buffer
    int params = 0, pending = 0;
    Communicator* comm = nullptr;  // dp, or expert_dp for a bucket of held experts
    Request request;
    bool started = false, done = false;
    double posted = 0, seen_done = 0;  // mpi::wtime()
  };
  void start(Bucket& b);
  bool test_all();
  void poll();
  Tensor grads(const Bucket& b) const;
  Tensor staged(const Bucket& b) const;

  ParamStore& store_;
  Communicator& dp_;
  bool overlap_, armed_ = false;
  DpProgress progress_;
  Buffer staging_;  // bf16 reduction: the buckets' gradients rounded to bf16
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_param_;
  int started_early_ = 0;
  DpSyncTiming last_;
};

}  // namespace tessera
