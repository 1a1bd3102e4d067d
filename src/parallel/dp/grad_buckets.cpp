#include "parallel/dp/grad_buckets.hpp"

namespace tessera {

GradBuckets::GradBuckets(ParamStore& store, Communicator& dp, double bucket_mb, bool overlap)
    : store_(store), dp_(dp), overlap_(overlap) {
  const std::vector<Param*> params = store.params();
  bucket_of_param_.assign(params.size(), -1);
  const int64_t limit = std::max<int64_t>(1, int64_t(bucket_mb * 1024 * 1024 / 4));
  const int64_t total = store.numel();
  Bucket current;
  current.end = total;
  for (int i = int(params.size()) - 1; i >= 0; --i) {
    bucket_of_param_[size_t(i)] = int(buckets_.size());
    ++current.params;
    current.begin = params[size_t(i)]->offset;
    if (current.end - current.begin >= limit || i == 0) {
      if (i == 0) current.begin = 0;
      buckets_.push_back(current);
      current = Bucket();
      current.end = params[size_t(i)]->offset;
    }
  }
}

void GradBuckets::arm(bool last_microbatch) {
  armed_ = last_microbatch && dp_.size() > 1;
  if (!armed_) return;
  started_early_ = 0;
  for (Bucket& b : buckets_) b.pending = b.params, b.started = false;
}

void GradBuckets::start(Bucket& b) {
  b.request = dp_.all_reduce_async(store_.grads() + b.begin, b.end - b.begin);
  b.started = true;
}

void GradBuckets::poll() {
  for (Bucket& b : buckets_)
    if (b.started && !b.request.done()) b.request.test();
}

void GradBuckets::ready(int first, int last) {
  if (!armed_ || !overlap_) return;
  for (int i = first; i < last; ++i) {
    Bucket& b = buckets_[size_t(bucket_of_param_[size_t(i)])];
    if (--b.pending == 0) {
      start(b);
      ++started_early_;
    }
  }
  poll();
}

void GradBuckets::finish() {
  if (!armed_) return;
  for (Bucket& b : buckets_)
    if (!b.started) start(b);
  for (Bucket& b : buckets_) b.request.wait();
  armed_ = false;
}

}  // namespace tessera
