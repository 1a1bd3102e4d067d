// Data-parallel gradient reduction in buckets, overlapped with backward.
//
// Gradients live in one flat buffer in parameter-registration (forward) order; backward
// finishes them in roughly the reverse order. Buckets are contiguous ranges of that buffer
// of about parallel.bucket_mb, formed from the last parameter backwards. During the final
// micro-batch's backward the model reports each layer's parameters as final (ready()); a
// bucket whose parameters are all final starts its all-reduce at once (non-blocking) while
// backward continues. MPI moves a non-blocking collective only inside MPI calls, so every
// ready() also polls the buckets in flight. Earlier micro-batches only accumulate: nothing is
// reduced until the last one.
#pragma once

#include <vector>

#include "comm/communicator.hpp"
#include "model/param.hpp"

namespace tessera {

class GradBuckets {
 public:
  // overlap = false reduces every bucket after backward (for comparison).
  GradBuckets(ParamStore& store, Communicator& dp, double bucket_mb, bool overlap);

  // Call before each micro-batch's backward; only the last one reduces.
  void arm(bool last_microbatch);
  // Parameters [first, last) of the store (registration indices) have final gradients.
  void ready(int first, int last);
  // Completes every reduction (starting any bucket not yet started).
  void finish();

  int buckets() const { return int(buckets_.size()); }
  // Buckets whose reduction had started before backward ended (last step).
  int started_early() const { return started_early_; }

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;  // element range in the flat gradient buffer
    int params = 0, pending = 0;
    Request request;
    bool started = false;
  };
  void start(Bucket& b);
  void poll();

  ParamStore& store_;
  Communicator& dp_;
  bool overlap_, armed_ = false;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_param_;
  int started_early_ = 0;
};

}  // namespace tessera
