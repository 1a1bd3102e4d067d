#include "parallel/dp/grad_buckets.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "comm/mpi_env.hpp"
#include "kernels/kernels.hpp"

namespace tessera {

DpSyncTiming& DpSyncTiming::operator+=(const DpSyncTiming& o) {
  buckets += o.buckets, bytes += o.bytes;
  in_flight += o.in_flight, exposed += o.exposed;
  posting += o.posting, polling += o.polling;
  return *this;
}

GradBuckets::GradBuckets(ParamStore& store, Communicator& dp, double bucket_mb, bool overlap,
                         DpProgress progress, ReduceDtype reduce, Allocator* alloc,
                         Communicator* expert_dp)
    : store_(store), dp_(dp), overlap_(overlap), progress_(progress) {
  if (reduce == ReduceDtype::bf16 && dp.size() > 1) {
    if (!alloc) throw std::logic_error("GradBuckets: a bf16 reduction needs an allocator");
    staging_ = Buffer(*alloc, Shape{store.numel()}, DType::bf16, Charge::comm);
  }
  const std::vector<Param*> params = store.params();
  bucket_of_param_.assign(params.size(), -1);
  const int64_t limit = std::max<int64_t>(1, int64_t(bucket_mb * 1024 * 1024 / 4));
  const int64_t total = store.numel();
  Bucket current;
  current.end = total;
  for (int i = int(params.size()) - 1; i >= 0; --i) {
    Communicator* comm = params[size_t(i)]->expert ? expert_dp : &dp;
    if (!comm) throw std::logic_error("GradBuckets: held experts need an expert_dp group");
    if (current.params > 0 && comm != current.comm) {  // held experts start or end here
      buckets_.push_back(current);
      current = Bucket();
      current.end = params[size_t(i) + 1]->offset;
    }
    current.comm = comm;
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
  last_ = DpSyncTiming();
  for (Bucket& b : buckets_) b.pending = b.params, b.started = b.done = false;
}

Tensor GradBuckets::grads(const Bucket& b) const {
  return view_of(store_.grads(), {store_.numel()}, store_.space()).slice(b.begin, b.end - b.begin);
}

Tensor GradBuckets::staged(const Bucket& b) const {
  return staging_.view().slice(b.begin, b.end - b.begin);
}

void GradBuckets::start(Bucket& b) {
  b.posted = mpi::wtime();
  if (staging_.empty()) {
    b.request = b.comm->all_reduce_async(grads(b));
  } else {
    kernels::cast(grads(b), staged(b), b.end - b.begin);
    b.request = b.comm->all_reduce_async(staged(b));
  }
  b.started = true;
}

// Tests every bucket in flight once; returns whether any is still in flight.
bool GradBuckets::test_all() {
  bool pending = false;
  for (Bucket& b : buckets_) {
    if (!b.started || b.done) continue;
    if (b.request.test()) {
      b.done = true, b.seen_done = mpi::wtime();
      if (!staging_.empty()) kernels::cast(staged(b), grads(b), b.end - b.begin);
    } else
      pending = true;
  }
  return pending;
}

void GradBuckets::poll() {
  if (progress_ == DpProgress::none) return;
  const double t0 = mpi::wtime();
  test_all();
  last_.polling += mpi::wtime() - t0;
}

void GradBuckets::ready(int first, int last) {
  if (!armed_ || !overlap_) return;
  for (int i = first; i < last; ++i) {
    Bucket& b = buckets_[size_t(bucket_of_param_[size_t(i)])];
    if (--b.pending == 0) {
      const double t0 = mpi::wtime();
      start(b);
      last_.posting += mpi::wtime() - t0;
      ++started_early_;
    }
  }
  poll();
}

void GradBuckets::finish() {
  if (!armed_) return;
  const double t0 = mpi::wtime();
  for (Bucket& b : buckets_)
    if (!b.started) start(b);
  // Like MPI_Waitall (which also spins in MPI's progress engine), but notes when each bucket
  // is first seen complete.
  while (test_all()) {
  }
  last_.exposed = mpi::wtime() - t0;
  // In flight: the union of the buckets' [posted, seen complete] intervals.
  std::vector<std::pair<double, double>> spans;
  for (const Bucket& b : buckets_) {
    spans.emplace_back(b.posted, b.seen_done);
    last_.bytes += (b.end - b.begin) * int64_t(staging_.empty() ? sizeof(float) : sizeof(uint16_t));
  }
  std::sort(spans.begin(), spans.end());
  double covered = 0, lo = spans.front().first, hi = spans.front().second;
  for (const auto& [a, z] : spans) {
    if (a > hi) covered += hi - lo, lo = a;
    hi = std::max(hi, z);
  }
  last_.in_flight = covered + (hi - lo);
  last_.buckets = int64_t(buckets_.size());
  armed_ = false;
}

}  // namespace tessera
