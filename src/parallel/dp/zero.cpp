#include "parallel/dp/zero.hpp"

#include <algorithm>

#include "kernels/kernels.hpp"

namespace tessera {

Buffer BufferPool::take(int64_t n) {
  // Only a buffer of exactly this size is reused: the sizes are the few part and piece sizes,
  // so the pool holds, per size, the most buffers ever in use at once.
  for (auto it = free_.begin(); it != free_.end(); ++it)
    if (it->numel() == n) {
      Buffer b = std::move(*it);
      free_.erase(it);
      return b;
    }
  return Buffer(alloc_, Shape{n}, DType::f32, charge_);
}

void BufferPool::give(Buffer&& b) {
  if (!b.empty()) free_.push_back(std::move(b));
}

StoreLayout Zero::layout(int stage, const Transformer& model, int64_t k) {
  StoreLayout l;
  l.parts = model.parts();
  l.align = 16 * k;  // pieces split evenly and stay 64-byte aligned
  l.values = stage < 3;
  l.grads = stage < 2;
  return l;
}

Zero::Zero(int stage, ParamStore& store, const Transformer& model, Communicator& dp,
           int64_t shard_group, bool overlap, int inflight, Allocator& alloc)
    : stage_(stage),
      store_(store),
      model_(model),
      k_(shard_group),
      overlap_(overlap),
      inflight_(std::max(1, inflight)),
      reducing_(store.parts().size(), false),
      deferred_(store.parts().size(), false),
      // Shard groups are consecutive data-parallel ranks; replicas hold the same shard.
      shard_comm_(dp.split(dp.rank() / int(k_), dp.rank() % int(k_), "dp_shard")),
      replica_comm_(dp.split(dp.rank() % int(k_), dp.rank() / int(k_), "dp_replica")),
      pool_(alloc, Charge::comm),
      parts_(store.parts().size()) {
  const int64_t r = shard_comm_.rank();
  for (size_t p = 0; p < store.parts().size(); ++p) {
    const ParamPart& part = store.parts()[p];
    const int64_t n = part.size / k_;
    segments_.push_back({part.begin + r * n, part.begin / k_, n});
    local_size_ += n;
  }
  grad_shard_ = Buffer(alloc, Shape{local_size_}, DType::f32, Charge::grads);
  if (stage_ == 3) value_shard_ = Buffer(alloc, Shape{local_size_}, DType::f32, Charge::params);
}

void Zero::point_values(int part, float* base) {
  const ParamPart& pp = store_.parts()[size_t(part)];
  for (int i = pp.first; i < pp.last; ++i) {
    Param& p = store_.param(i);
    p.value.data = base ? base + (p.offset - pp.begin) : nullptr;
  }
}

void Zero::point_grads(int part, float* base) {
  const ParamPart& pp = store_.parts()[size_t(part)];
  for (int i = pp.first; i < pp.last; ++i) {
    Param& p = store_.param(i);
    p.grad.data = base ? base + (p.offset - pp.begin) : nullptr;
  }
}

void Zero::initialize(uint64_t seed) {
  for (size_t q = 0; q < parts_.size(); ++q) {
    const int part = int(q);
    const ParamPart& pp = store_.parts()[q];
    if (pp.size == 0) continue;  // held by another pipeline stage
    Buffer full = pool_.take(pp.size);
    kernels::fill(full.view(), 0.0f, pp.size);
    point_values(part, full.f32());
    for (int i = pp.first; i < pp.last; ++i) ParamStore::initialize(store_.param(i), seed);
    kernels::copy(full.view().slice(shard_comm_.rank() * piece(part), piece(part)),
                  value_shard_.view().slice(local_of(part), piece(part)), piece(part));
    point_values(part, nullptr);
    pool_.give(std::move(full));
  }
}

void Zero::begin_step() {
  kernels::fill(grad_shard_.view(), 0.0f, local_size_);
  reducing_.assign(reducing_.size(), false);
}

// ---- stage 3: parameters gathered just in time ------------------------------------------------

void Zero::prefetch(int part) {
  PartState& s = parts_[size_t(part)];
  if (s.state != PartState::absent || piece(part) == 0) return;  // held by another stage
  const int64_t n = piece(part);
  s.values = pool_.take(n * k_);
  s.gather = shard_comm_.all_gather_async(value_shard_.f32() + local_of(part), s.values.f32(), n);
  s.state = PartState::gathering;
}

void Zero::need(int part) {
  prefetch(part);
  PartState& s = parts_[size_t(part)];
  if (s.state == PartState::gathering) {
    s.gather.wait();
    point_values(part, s.values.f32());
    s.state = PartState::ready;
  }
}

void Zero::drop(int part) {
  PartState& s = parts_[size_t(part)];
  if (s.state == PartState::absent) return;
  s.gather.wait();  // a buffer MPI still writes into cannot be reused
  point_values(part, nullptr);
  pool_.give(std::move(s.values));
  s.state = PartState::absent;
}

// ---- stages 2-3: gradients staged per part and reduce-scattered --------------------------------

void Zero::stage_grads(int part) {
  PartState& s = parts_[size_t(part)];
  const int64_t size = store_.parts()[size_t(part)].size;
  if (!s.grads.empty() || size == 0) return;
  s.grads = pool_.take(size);
  kernels::fill(s.grads.view(), 0.0f, size);
  point_grads(part, s.grads.f32());
}

void Zero::start_reduce(int part) {
  if (piece(part) == 0) return;  // a part another pipeline stage holds
  if (stage_ == 1) {  // straight from the full gradient buffer into the shard
    Pending p;
    p.part = part;
    p.request = shard_comm_.reduce_scatter_async(store_.grads() + store_.parts()[size_t(part)].begin,
                                                 grad_shard_.f32() + local_of(part), piece(part));
    pending_.push_back(std::move(p));
    reducing_[size_t(part)] = true;
    return;
  }
  PartState& s = parts_[size_t(part)];
  if (s.grads.empty()) return;  // nothing was written (cannot happen in a training pass)
  while (int(pending_.size()) >= inflight_) retire_oldest();
  point_grads(part, nullptr);
  Pending p;
  p.part = part;
  p.staged = std::move(s.grads);
  p.piece = pool_.take(piece(part));
  p.request = shard_comm_.reduce_scatter_async(p.staged.f32(), p.piece.f32(), piece(part));
  pending_.push_back(std::move(p));
}

void Zero::complete(Pending& p) {
  p.request.wait();
  if (p.piece.empty()) return;  // stage 1 reduced into the shard directly
  kernels::add_inplace(grad_shard_.view().slice(local_of(p.part), piece(p.part)), p.piece.view(),
                       piece(p.part));
  pool_.give(std::move(p.staged));
  pool_.give(std::move(p.piece));
}

void Zero::retire_oldest() {
  complete(pending_.front());
  pending_.erase(pending_.begin());
}

void Zero::poll() {
  // Drives MPI's progress on the collectives in flight. Finished reductions are retired only
  // in order, when the in-flight bound needs it or at the step's end: buffers then come and
  // go at the same points in every run (tessera-plan predicts them exactly).
  for (Pending& p : pending_) p.request.test();
  for (PartState& s : parts_)
    if (s.state == PartState::gathering) s.gather.test();
}

void Zero::begin(int part, Pass pass, bool training) {
  if (stage_ < 2) return;
  poll();
  if (stage_ == 3) {
    for (int q : model_.reads(part, pass)) need(q);
    // Start the next pass's gather now so it overlaps this part's compute.
    const int next = pass == Pass::forward ? part + 1 : part - 1;
    if (next >= 0 && next <= model_.head_part())
      for (int q : model_.reads(next, pass)) prefetch(q);
  }
  if (training)
    for (int q : model_.writes_grads(part, pass)) stage_grads(q);
}

void Zero::end(int part, Pass pass, bool training) {
  if (stage_ == 1) {
    if (training && pass == Pass::backward && armed_ && !deferred_[size_t(part)]) start_reduce(part);
    poll();
    return;
  }
  if (stage_ == 3) {
    // Release what this pass read, except the head's parameters, which its backward (next,
    // in training) reads again.
    const bool head_backward_next = training && pass == Pass::forward && part == model_.head_part();
    const std::vector<int> keep =
        head_backward_next ? model_.reads(part, Pass::backward) : std::vector<int>{};
    for (int q : model_.reads(part, pass))
      if (std::find(keep.begin(), keep.end(), q) == keep.end()) drop(q);
  }
  if (training && pass == Pass::backward && !deferred_[size_t(part)])
    start_reduce(part);  // its gradients are final for this micro-batch
  poll();
}

// ---- the step --------------------------------------------------------------------------------

float* Zero::reduce_gradients(const std::function<void()>& before_deferred) {
  if (before_deferred) before_deferred();
  // Stage 1: parts not reduced during backward (deferred, or parallel.overlap = false).
  // Stages 2-3: parts whose gradients are still staged (deferred, or written without a
  // backward pass of their own on this stage, like the last stage's tied table copy).
  for (size_t q = 0; q < parts_.size(); ++q)
    if (stage_ == 1 ? !reducing_[q] : !parts_[q].grads.empty()) start_reduce(int(q));
  for (Pending& p : pending_) complete(p);
  pending_.clear();
  armed_ = false;
  if (stage_ == 3)
    for (size_t q = 0; q < parts_.size(); ++q) drop(int(q));  // nothing stays gathered
  replica_comm_.all_reduce(grad_shard_.f32(), local_size_);  // HSDP: sum over shard groups
  return grad_shard_.f32();
}

void Zero::gather_values() {
  if (stage_ == 3) return;  // the shard is the only copy; forward gathers it
  for (size_t q = 0; q < parts_.size(); ++q) {
    const ParamPart& pp = store_.parts()[q];
    const int64_t n = piece(int(q));
    if (n == 0) continue;
    float* part = store_.values() + pp.begin;
    shard_comm_.all_gather(part + shard_comm_.rank() * n, part, n);  // in place
  }
}

}  // namespace tessera
