#include "model/param.hpp"

#include <algorithm>
#include <stdexcept>

#include "core/rng.hpp"
#include "kernels/kernels.hpp"

namespace tessera {

Param& ParamStore::add(std::string name, Shape shape, ParamInit init, bool decay,
                       TpSplit split) {
  if (!parts_.empty()) throw std::logic_error("ParamStore::add after finalize: " + name);
  Param& p = params_.emplace_back();
  p.name = std::move(name);
  p.global = shape;
  p.local = shape;
  if (split.split()) {
    if (split.dim >= shape.ndim || shape[split.dim] % split.parts != 0)
      throw std::logic_error("parameter " + p.name + " " + shape.str() +
                             " does not split into " + std::to_string(split.parts) +
                             " blocks along dimension " + std::to_string(split.dim));
    p.local.dims[size_t(split.dim)] /= split.parts;
    p.tp = split;
  }
  p.init = init;
  p.decay = decay;
  return p;
}

void ParamStore::finalize(Allocator& alloc, const StoreLayout& layout, DType compute) {
  if (!parts_.empty()) throw std::logic_error("ParamStore::finalize called twice");
  if (compute != DType::f32 && compute != DType::bf16 && compute != DType::f16)
    throw std::logic_error(std::string("ParamStore: no compute copy in ") + dtype_name(compute));
  compute_dtype_ = compute;
  alloc_ = &alloc;
  space_ = alloc.space();
  std::vector<std::pair<int, int>> ranges = layout.parts;
  if (ranges.empty()) ranges.push_back({0, int(params_.size())});
  const int64_t align = std::max<int64_t>(16, layout.align);
  auto round_up = [](int64_t n, int64_t m) { return (n + m - 1) / m * m; };
  numel_ = 0;
  const int64_t expert_align = std::max<int64_t>(16, layout.expert_align);
  for (auto [first, last] : ranges) {
    ParamPart part{first, last, numel_, 0, 0};
    int64_t at = numel_;
    int i = first;
    for (; i < last && !params_[size_t(i)].expert; ++i) {
      params_[size_t(i)].offset = at;
      at += round_up(params_[size_t(i)].local.numel(), 16);  // 64-byte aligned parameters
    }
    const int64_t experts = at = part.begin + round_up(at - part.begin, align);
    for (; i < last; ++i) {
      if (!params_[size_t(i)].expert)
        throw std::logic_error("ParamStore: held experts must end their part: " +
                               params_[size_t(i)].name);
      params_[size_t(i)].offset = at;
      at += round_up(params_[size_t(i)].local.numel(), 16);
    }
    part.experts = round_up(at - experts, expert_align);
    part.size = experts - part.begin + part.experts;
    numel_ = part.begin + part.size;
    parts_.push_back(part);
  }
  if (layout.values) values_ = Buffer(alloc, Shape{numel_}, DType::f32, Charge::params);
  if (layout.grads) grads_ = Buffer(alloc, Shape{numel_}, DType::f32, Charge::grads);
  // Without the value buffer (ZeRO-3) the owner makes each part's compute copy when it gathers it.
  if (compute != DType::f32 && layout.values)
    compute_ = Buffer(alloc, Shape{numel_}, compute, Charge::params);
  auto slice = [&](const Buffer& b, const Param& p, DType dtype) {
    return b.empty() ? Tensor{nullptr, dtype, space_, p.local}
                     : b.view().slice(p.offset, p.local.numel()).reshaped(p.local);
  };
  for (Param& p : params_) {
    p.value = slice(values_, p, DType::f32);
    p.grad = slice(grads_, p, DType::f32);
    p.compute = compute == DType::f32 ? p.value
                : compute_.empty()
                    ? Tensor{nullptr, compute, space_, p.local}
                    : compute_.view().slice(p.offset, p.local.numel()).reshaped(p.local);
  }
}

void ParamStore::refresh_compute() {
  if (!compute_.empty()) kernels::cast(values_.view(), compute_.view(), numel_);
}

int64_t ParamStore::elements() const {
  int64_t n = 0;
  for (const Param& p : params_) n += p.local.numel();
  return n;
}

void ParamStore::initialize(uint64_t seed) {
  for (Param& p : params_) initialize(p, seed);
}

namespace {

// The initial values of p (a pure function of seed, name and global index), into host memory.
void initial_values(const Param& p, uint64_t seed, const Tensor& value) {
  float* v = value.f32();
  const int64_t n = p.global.numel();
  const int64_t row = p.global.ndim > 1 ? n / p.global[0] : 1;
  const int64_t valid = p.init.valid_rows < 0 ? n : p.init.valid_rows * row;
  const CounterRng rng(seed, p.name);
  if (p.tp.split()) {
    // Element i of the block is element global_index(i) of the whole tensor.
    const int64_t nl = p.local.numel(), d = p.tp.dim;
    int64_t inner = 1;  // elements per step along the split dimension
    for (int i = int(d) + 1; i < p.global.ndim; ++i) inner *= p.global[i];
    const int64_t block = p.local[int(d)] * inner, whole = p.global[int(d)] * inner;
    const int64_t start = p.tp.index * block;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < nl; ++i) {
      const int64_t g = (i / block) * whole + start + i % block;
      float pair[2];
      rng.normal_pair(uint64_t(g / 2), pair);
      v[i] = p.init.kind == ParamInit::ones    ? 1.0f
             : p.init.kind == ParamInit::zeros ? 0.0f
             : g < valid                       ? p.init.std * pair[g % 2]
                                               : 0.0f;
    }
    return;
  }
  switch (p.init.kind) {
    case ParamInit::ones:
      kernels::fill(value, 1.0f, n);
      break;
    case ParamInit::zeros:
      kernels::fill(value, 0.0f, n);
      break;
    case ParamInit::normal:
      // Elements 2j and 2j+1 share one Philox call (CounterRng::normal_pair).
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < (n + 1) / 2; ++j) {
        float pair[2];
        rng.normal_pair(uint64_t(j), pair);
        for (int64_t i = 2 * j; i < std::min(n, 2 * j + 2); ++i)
          v[i] = i < valid ? p.init.std * pair[i - 2 * j] : 0.0f;
      }
      break;
  }
}

}  // namespace

void ParamStore::initialize(Param& p, uint64_t seed) {
  if (p.value.space == Space::host) return initial_values(p, seed, p.value);
  Buffer host(alloc_->host(), p.local, DType::f32, Charge::workspace);  // staging
  initial_values(p, seed, host.view());
  kernels::transfer(host.view(), p.value, p.local.numel());
}

void ParamStore::zero_grads() {
  if (!grads_.empty()) kernels::fill(grads_.view(), 0.0f, numel_);
}

std::vector<Param*> ParamStore::params() {
  std::vector<Param*> out;
  for (Param& p : params_) out.push_back(&p);
  return out;
}

const Param* ParamStore::find(const std::string& name) const {
  for (const Param& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

}  // namespace tessera
