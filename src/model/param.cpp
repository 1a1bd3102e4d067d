#include "model/param.hpp"

#include <algorithm>
#include <stdexcept>

#include "core/rng.hpp"
#include "kernels/kernels.hpp"

namespace tessera {

Param& ParamStore::add(std::string name, Shape shape, ParamInit init, bool decay) {
  if (!values_.empty()) throw std::logic_error("ParamStore::add after finalize: " + name);
  Param& p = params_.emplace_back();
  p.name = std::move(name);
  p.global = shape;
  p.init = init;
  p.decay = decay;
  p.offset = numel_;
  // Keep every parameter 64-byte aligned inside the flat buffers.
  numel_ += (shape.numel() + 15) / 16 * 16;
  return p;
}

void ParamStore::finalize(Allocator& alloc, int64_t pad_multiple) {
  numel_ = (numel_ + pad_multiple - 1) / pad_multiple * pad_multiple;
  values_ = Buffer(alloc, Shape{numel_}, DType::f32, Charge::params);
  grads_ = Buffer(alloc, Shape{numel_}, DType::f32, Charge::grads);
  for (Param& p : params_) {
    p.value = Tensor{values_.f32() + p.offset, DType::f32, Space::host, p.global};
    p.grad = Tensor{grads_.f32() + p.offset, DType::f32, Space::host, p.global};
  }
}

void ParamStore::initialize(uint64_t seed) {
  for (Param& p : params_) {
    float* v = p.value.f32();
    const int64_t n = p.global.numel();
    const int64_t row = p.global.ndim > 1 ? n / p.global[0] : 1;
    const int64_t valid = p.init.valid_rows < 0 ? n : p.init.valid_rows * row;
    const CounterRng rng(seed, p.name);
    switch (p.init.kind) {
      case ParamInit::ones:
        kernels::fill(v, 1.0f, n);
        break;
      case ParamInit::zeros:
        kernels::fill(v, 0.0f, n);
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
}

void ParamStore::zero_grads() { kernels::fill(grads_.f32(), 0.0f, numel_); }

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
