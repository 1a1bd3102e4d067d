#include "parallel/dp/zero.hpp"

#include <algorithm>

#include "kernels/kernels.hpp"

namespace tessera {

Buffer BufferPool::take(int64_t n, DType dtype) {
  // Only a buffer of exactly this size and dtype is reused: the sizes are the few part and
  // piece sizes, so the pool holds, per size, the most buffers ever in use at once.
  for (auto it = free_.begin(); it != free_.end(); ++it)
    if (it->numel() == n && it->view().dtype == dtype) {
      Buffer b = std::move(*it);
      free_.erase(it);
      return b;
    }
  return Buffer(alloc_, Shape{n}, dtype, charge_);
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

namespace {

std::vector<int64_t> part_sizes(const ParamStore& store) {
  std::vector<int64_t> size;
  for (const ParamPart& p : store.parts()) size.push_back(p.size);
  return size;
}

}  // namespace

Zero::Zero(int stage, ParamStore& store, const Transformer& model, Communicator& dp,
           Communicator& holders, int64_t shard_group, bool overlap, int inflight, DType reduce,
           Allocator& alloc)
    : stage_(stage),
      store_(store),
      k_(shard_group),
      overlap_(overlap),
      reduce_dtype_(reduce),
      half_gather_(stage == 3 && store.compute_dtype() != DType::f32),
      // Shard groups are consecutive data-parallel ranks; replicas hold the same shard.
      shard_comm_(dp.split(dp.rank() / int(k_), dp.rank() % int(k_), "dp_shard")),
      replica_comm_(dp.split(dp.rank() % int(k_), dp.rank() / int(k_), "dp_replica")),
      holders_(holders),
      whole_{{0, 0, store.numel()}},
      pool_(alloc, Charge::comm),
      schedule_(stage, model.access(), part_sizes(store), inflight),
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
  if (half_gather_)
    compute_shard_ = Buffer(alloc, Shape{local_size_}, store.compute_dtype(), Charge::params);
}

void Zero::refresh_compute() {
  store_.refresh_compute();  // stages 1-2: the whole copy; stage 3 has no flat value buffer
  if (half_gather_) kernels::cast(value_shard_.view(), compute_shard_.view(), local_size_);
}

void Zero::point_values(int part, float* base) {
  const ParamPart& pp = store_.parts()[size_t(part)];
  const PartState& s = parts_[size_t(part)];
  const bool copy = store_.compute_dtype() != DType::f32;
  for (int i = pp.first; i < pp.last; ++i) {
    Param& p = store_.param(i);
    p.value.data = base ? base + (p.offset - pp.begin) : nullptr;
    if (!copy) {
      p.compute.data = p.value.data;
    } else if (base && !s.compute.empty()) {
      p.compute = s.compute.view().slice(p.offset - pp.begin, p.local.numel()).reshaped(p.local);
    } else {
      p.compute.data = nullptr;
    }
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
  if (stage_ < 3) {
    store_.initialize(seed);
    return;
  }
  seed_ = seed;
  run(schedule_.initialize());
}

void Zero::build(int part) {
  const ParamPart& pp = store_.parts()[size_t(part)];
  Buffer full = pool_.take(pp.size);
  kernels::fill(full.view(), 0.0f, pp.size);
  point_values(part, full.ptr_f32());
  for (int i = pp.first; i < pp.last; ++i) store_.initialize(store_.param(i), seed_);
  kernels::copy(full.view().slice(shard_comm_.rank() * piece(part), piece(part)),
                value_shard_.view().slice(local_of(part), piece(part)), piece(part));
  point_values(part, nullptr);
  pool_.give(std::move(full));
}

void Zero::begin_step() {
  kernels::fill(grad_shard_.view(), 0.0f, local_size_);
  schedule_.begin_step();
}

void Zero::reduce(int part) {
  Pending p;
  p.part = part;
  if (reduce_dtype_ != DType::f32) {
    const int64_t size = store_.parts()[size_t(part)].size;
    Buffer wide;  // stages 2-3: the part's staged fp32 gradients
    Tensor grads =
        store_.grads() ? view_of(store_.grads(), Shape{store_.numel()}, store_.space()) : Tensor{};
    if (stage_ == 1) {
      grads = grads.slice(store_.parts()[size_t(part)].begin, size);
    } else {
      point_grads(part, nullptr);
      wide = std::move(parts_[size_t(part)].grads);
      grads = wide.view();
    }
    p.staged = pool_.take(size, reduce_dtype_);
    kernels::cast(grads, p.staged.view(), size);
    pool_.give(std::move(wide));
    p.piece = pool_.take(piece(part), reduce_dtype_);
    p.request = shard_comm_.reduce_scatter_async(p.staged.view(), p.piece.view());
  } else if (stage_ == 1) {  // straight from the full gradient buffer into the shard
    const Tensor grads = view_of(store_.grads(), Shape{store_.numel()}, store_.space());
    p.request = shard_comm_.reduce_scatter_async(
        grads.slice(store_.parts()[size_t(part)].begin, piece(part) * shard_comm_.size()),
        grad_shard_.view().slice(local_of(part), piece(part)));
  } else {
    PartState& s = parts_[size_t(part)];
    point_grads(part, nullptr);
    p.staged = std::move(s.grads);
    p.piece = pool_.take(piece(part));
    p.request = shard_comm_.reduce_scatter_async(
        p.staged.view().slice(0, piece(part) * shard_comm_.size()),
        p.piece.view().slice(0, piece(part)));
  }
  pending_.push_back(std::move(p));
}

void Zero::retire() {
  Pending& p = pending_.front();
  p.request.wait();
  if (!p.piece.empty()) {  // stage 1 in f32 reduced into the shard directly
    const int64_t n = piece(p.part);
    const Tensor shard = grad_shard_.view().slice(local_of(p.part), n);
    if (p.piece.view().dtype == DType::f32) {
      kernels::add_inplace(shard, p.piece.view(), n);
    } else {  // widened, then added
      Buffer wide = pool_.take(n);
      kernels::cast(p.piece.view(), wide.view(), n);
      kernels::add_inplace(shard, wide.view(), n);
      pool_.give(std::move(wide));
    }
    pool_.give(std::move(p.staged));
    pool_.give(std::move(p.piece));
  }
  pending_.pop_front();
}

void Zero::run(const std::vector<ZeroAction>& actions) {
  for (const ZeroAction& a : actions) {
    PartState& s = parts_[size_t(a.part)];
    switch (a.kind) {
      case ZeroAction::build: build(a.part); break;
      case ZeroAction::fetch: {
        const int64_t n = piece(a.part);
        const Buffer& shard = half_gather_ ? compute_shard_ : value_shard_;
        Buffer& into = half_gather_ ? s.compute : s.values;
        into = pool_.take(n * k_, shard.view().dtype);
        s.gather = shard_comm_.all_gather_async(shard.view().slice(local_of(a.part), n), into.view());
        break;
      }
      case ZeroAction::wait:
        s.gather.wait();
        if (half_gather_ && s.values.empty()) {  // the fp32 values the layers read, widened
                                                  // once per gather from the gathered copy
          const int64_t size = store_.parts()[size_t(a.part)].size;
          s.values = pool_.take(size);
          kernels::cast(s.compute.view(), s.values.view(), size);
        }
        point_values(a.part, s.values.ptr_f32());
        break;
      case ZeroAction::release:
        s.gather.wait();  // a buffer MPI still writes into cannot be reused
        point_values(a.part, nullptr);
        pool_.give(std::move(s.values));
        pool_.give(std::move(s.compute));
        break;
      case ZeroAction::stage: {
        const int64_t size = store_.parts()[size_t(a.part)].size;
        s.grads = pool_.take(size);
        kernels::fill(s.grads.view(), 0.0f, size);
        point_grads(a.part, s.grads.ptr_f32());
        break;
      }
      case ZeroAction::reduce: reduce(a.part); break;
      case ZeroAction::retire: retire(); break;
    }
  }
}

void Zero::poll() {
  // Drives MPI's progress on the collectives in flight. Finished reductions are retired only
  // in order, when the in-flight bound needs it or at the step's end: buffers then come and
  // go at the same points in every run (tessera-plan predicts them exactly).
  for (Pending& p : pending_) p.request.test();
  for (PartState& s : parts_)
    if (!s.values.empty() || !s.compute.empty()) s.gather.test();  // a gather in flight
}

void Zero::begin(int part, Pass pass, bool training) {
  if (stage_ < 2) return;
  poll();
  run(schedule_.begin(part, pass, training));
}

void Zero::end(int part, Pass pass, bool training) {
  run(schedule_.end(part, pass, training, armed_));
  poll();
}

const float* Zero::reduce_gradients(const std::function<void()>& whole_final) {
  if (whole_final) whole_final();
  run(schedule_.finish());
  armed_ = false;
  if (replica_comm_.size() > 1 && reduce_dtype_ != DType::f32) {  // HSDP: sum over shard groups
    Buffer h = pool_.take(local_size_, reduce_dtype_);
    kernels::cast(grad_shard_.view(), h.view(), local_size_);
    replica_comm_.all_reduce_async(h.view()).wait();
    kernels::cast(h.view(), grad_shard_.view(), local_size_);
    pool_.give(std::move(h));
  } else {
    replica_comm_.all_reduce(grad_shard_.view().slice(0, local_size_));
  }
  return grad_shard_.ptr_f32();
}

void Zero::after_optimizer() {
  if (stage_ == 3) return;
  for (size_t q = 0; q < parts_.size(); ++q) {
    const ParamPart& pp = store_.parts()[q];
    const int64_t n = piece(int(q));
    if (n == 0) continue;
    const Tensor part = view_of(store_.values(), Shape{store_.numel()}, store_.space())
                            .slice(pp.begin, n * shard_comm_.size());
    shard_comm_.all_gather(part.slice(shard_comm_.rank() * n, n), part);  // in place
  }
}

Holding Zero::values() {
  if (stage_ == 3) return {value_shard_.ptr_f32(), &segments_, &replica_comm_};
  return {store_.values(), &whole_, &holders_};
}

std::string Zero::sync_settings() const {
  return overlap_ ? "overlap on" : "overlap off";
}

}  // namespace tessera
