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

StoreLayout Zero::layout(int stage, const Transformer& model, int64_t k, int64_t expert_k) {
  StoreLayout l;
  l.parts = model.parts();
  l.align = 16 * k;  // pieces split evenly and stay 64-byte aligned
  l.expert_align = 16 * expert_k;
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
           Allocator& alloc, Communicator* expert_dp, int64_t expert_group)
    : stage_(stage),
      store_(store),
      k_(shard_group),
      expert_k_(expert_group),
      overlap_(overlap),
      reduce_dtype_(reduce),
      half_gather_(stage == 3 && store.compute_dtype() != DType::f32),
      // Shard groups are consecutive data-parallel ranks; replicas hold the same shard.
      shard_comm_(dp.split(dp.rank() / int(k_), dp.rank() % int(k_), "dp_shard")),
      replica_comm_(dp.split(dp.rank() % int(k_), dp.rank() / int(k_), "dp_replica")),
      holders_(holders),
      expert_dp_(expert_dp),
      whole_{{0, 0, store.numel()}},
      pool_(alloc, Charge::comm),
      schedule_(stage, model.access(), part_sizes(store), inflight),
      parts_(store.parts().size()) {
  for (const ParamPart& part : store.parts()) has_experts_ = has_experts_ || part.experts > 0;
  if (has_experts_) {
    if (!expert_dp) throw std::logic_error("Zero: held experts need an expert_dp group");
    const int e = expert_dp->rank(), ke = int(expert_k_);
    expert_shard_comm_ = expert_dp->split(e / ke, e % ke, "edp_shard");
    expert_replica_comm_ = expert_dp->split(e % ke, e / ke, "edp_replica");
  }
  // Sections and the local layout: every part's dense piece, then every expert piece.
  sections_.resize(store.parts().size());
  for (size_t p = 0; p < store.parts().size(); ++p) {
    const ParamPart& part = store.parts()[p];
    const int64_t dense = part.size - part.experts;
    Section d{part.begin, dense, k_, local_size_, false};
    sections_[p].push_back(d);
    segments_.push_back({d.begin + shard_comm_.rank() * d.piece(), d.local, d.piece()});
    local_size_ += d.piece();
  }
  dense_local_ = local_size_;
  for (size_t p = 0; p < store.parts().size(); ++p) {
    const ParamPart& part = store.parts()[p];
    if (part.experts == 0) continue;
    Section x{part.begin + part.size - part.experts, part.experts, expert_k_, local_size_, true};
    sections_[p].push_back(x);
    segments_.push_back({x.begin + expert_shard_comm_.rank() * x.piece(), x.local, x.piece()});
    local_size_ += x.piece();
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
  for (const Section& x : sections_[size_t(part)])
    kernels::copy(full.view().slice(x.begin - pp.begin + shard_of(x).rank() * x.piece(), x.piece()),
                  value_shard_.view().slice(x.local, x.piece()), x.piece());
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
  const int64_t begin = store_.parts()[size_t(part)].begin;
  const std::vector<Section>& sections = sections_[size_t(part)];
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
    int64_t at = 0;  // the sections' pieces, one after the other
    for (const Section& x : sections) {
      p.request.push_back(shard_of(x).reduce_scatter_async(
          p.staged.view().slice(x.begin - begin, x.size), p.piece.view().slice(at, x.piece())));
      at += x.piece();
    }
  } else if (stage_ == 1) {  // straight from the full gradient buffer into the shard
    const Tensor grads = view_of(store_.grads(), Shape{store_.numel()}, store_.space());
    for (const Section& x : sections)
      p.request.push_back(shard_of(x).reduce_scatter_async(
          grads.slice(x.begin, x.size), grad_shard_.view().slice(x.local, x.piece())));
  } else {
    PartState& s = parts_[size_t(part)];
    point_grads(part, nullptr);
    p.staged = std::move(s.grads);
    p.piece = pool_.take(piece(part));
    int64_t at = 0;
    for (const Section& x : sections) {
      p.request.push_back(shard_of(x).reduce_scatter_async(
          p.staged.view().slice(x.begin - begin, x.size), p.piece.view().slice(at, x.piece())));
      at += x.piece();
    }
  }
  pending_.push_back(std::move(p));
}

void Zero::retire() {
  Pending& p = pending_.front();
  for (Request& r : p.request) r.wait();
  if (!p.piece.empty()) {  // stage 1 in f32 reduced into the shard directly
    const int64_t n = piece(p.part);
    // Each section's piece into its place in the shard.
    auto add = [&](const Tensor& pieces) {
      int64_t at = 0;
      for (const Section& x : sections_[size_t(p.part)]) {
        kernels::add_inplace(grad_shard_.view().slice(x.local, x.piece()),
                             pieces.slice(at, x.piece()), x.piece());
        at += x.piece();
      }
    };
    if (p.piece.view().dtype == DType::f32) {
      add(p.piece.view());
    } else {  // widened, then added
      Buffer wide = pool_.take(n);
      kernels::cast(p.piece.view(), wide.view(), n);
      add(wide.view());
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
        const ParamPart& pp = store_.parts()[size_t(a.part)];
        const Buffer& shard = half_gather_ ? compute_shard_ : value_shard_;
        Buffer& into = half_gather_ ? s.compute : s.values;
        into = pool_.take(pp.size, shard.view().dtype);
        s.gather.clear();
        for (const Section& x : sections_[size_t(a.part)])
          s.gather.push_back(
              shard_of(x).all_gather_async(shard.view().slice(x.local, x.piece()),
                                           into.view().slice(x.begin - pp.begin, x.size)));
        break;
      }
      case ZeroAction::wait:
        for (Request& r : s.gather) r.wait();
        if (half_gather_ && s.values.empty()) {  // the fp32 values the layers read, widened
                                                  // once per gather from the gathered copy
          const int64_t size = store_.parts()[size_t(a.part)].size;
          s.values = pool_.take(size);
          kernels::cast(s.compute.view(), s.values.view(), size);
        }
        point_values(a.part, s.values.ptr_f32());
        break;
      case ZeroAction::release:
        for (Request& r : s.gather) r.wait();  // a buffer MPI still writes into cannot be reused
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
  for (Pending& p : pending_)
    for (Request& r : p.request) r.test();
  for (PartState& s : parts_)
    if (!s.values.empty() || !s.compute.empty())  // a gather in flight
      for (Request& r : s.gather) r.test();
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
  // HSDP: sum over shard groups, the dense pieces over the replica group, the experts' over
  // the expert replica group.
  auto sum = [&](Communicator& replicas, int64_t begin, int64_t n) {
    const Tensor grads = grad_shard_.view().slice(begin, n);
    if (replicas.size() > 1 && reduce_dtype_ != DType::f32) {
      Buffer h = pool_.take(n, reduce_dtype_);
      kernels::cast(grads, h.view(), n);
      replicas.all_reduce_async(h.view()).wait();
      kernels::cast(h.view(), grads, n);
      pool_.give(std::move(h));
    } else {
      replicas.all_reduce(grads);
    }
  };
  sum(replica_comm_, 0, dense_local_);
  if (has_experts_) sum(expert_replica_comm_, dense_local_, local_size_ - dense_local_);
  return grad_shard_.ptr_f32();
}

void Zero::after_optimizer() {
  if (stage_ == 3) return;
  const Tensor values = view_of(store_.values(), Shape{store_.numel()}, store_.space());
  for (size_t q = 0; q < parts_.size(); ++q)
    for (const Section& x : sections_[q]) {
      const int64_t n = x.piece();
      if (n == 0) continue;
      Communicator& shard = shard_of(x);
      const Tensor section = values.slice(x.begin, n * shard.size());
      shard.all_gather(section.slice(shard.rank() * n, n), section);  // in place
    }
}

Holding Zero::values() {
  if (stage_ == 3)
    return {value_shard_.ptr_f32(), &segments_, &replica_comm_, &expert_replica_comm_};
  return {store_.values(), &whole_, &holders_, expert_dp_};
}

std::string Zero::sync_settings() const {
  return overlap_ ? "overlap on" : "overlap off";
}

}  // namespace tessera
