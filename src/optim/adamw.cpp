#include "optim/adamw.hpp"

#include <cmath>

#include "kernels/kernels.hpp"

namespace tessera {

AdamW::AdamW(ParamStore& store, Allocator& alloc, AdamWConfig cfg)
    : store_(store),
      cfg_(cfg),
      m_(alloc, Shape{store.numel()}, DType::f32, Charge::optimizer),
      v_(alloc, Shape{store.numel()}, DType::f32, Charge::optimizer) {}

bool AdamW::decays(const Param& p) const {
  return p.decay || (cfg_.decay_embeddings && p.name.rfind("embed.", 0) == 0);
}

void AdamW::step(double lr, int64_t step, float grad_scale) {
  for (Param* p : store_.params()) {
    const kernels::AdamWArgs args{float(lr), cfg_.beta1, cfg_.beta2, cfg_.eps,
                                  decays(*p) ? cfg_.weight_decay : 0.0f, step, grad_scale};
    kernels::adamw(p->value.f32(), p->grad.f32(), m_.f32() + p->offset, v_.f32() + p->offset,
                   p->global.numel(), args);
  }
}

double grad_norm(const ParamStore& store) {
  return std::sqrt(kernels::sum_squares(store.grads(), store.numel()));
}

float clip_factor(double norm, double clip) {
  if (clip <= 0) return 1.0f;
  const double coef = clip / (norm + 1e-6);
  return coef < 1.0 ? float(coef) : 1.0f;
}

}  // namespace tessera
