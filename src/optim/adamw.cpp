#include "optim/adamw.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/kernels.hpp"

namespace tessera {

AdamW::AdamW(ParamStore& store, Allocator& alloc, AdamWConfig cfg, int64_t begin, int64_t end)
    : store_(store),
      cfg_(cfg),
      begin_(begin),
      end_(end),
      m_(alloc, Shape{end - begin}, DType::f32, Charge::optimizer),
      v_(alloc, Shape{end - begin}, DType::f32, Charge::optimizer) {}

bool AdamW::decays(const Param& p) const {
  return p.decay || (cfg_.decay_embeddings && p.name.rfind("embed.", 0) == 0);
}

void AdamW::step(double lr, int64_t step, const float* grads, float grad_scale) {
  for (Param* p : store_.params()) {
    // The part of this parameter inside [begin_, end_).
    const int64_t a = std::max(begin_, p->offset);
    const int64_t b = std::min(end_, p->offset + p->global.numel());
    if (a >= b) continue;
    const kernels::AdamWArgs args{float(lr), cfg_.beta1, cfg_.beta2, cfg_.eps,
                                  decays(*p) ? cfg_.weight_decay : 0.0f, step, grad_scale};
    kernels::adamw(store_.values() + a, grads + (a - begin_), m_.f32() + (a - begin_),
                   v_.f32() + (a - begin_), b - a, args);
  }
}

float clip_factor(double norm, double clip) {
  if (clip <= 0) return 1.0f;
  const double coef = clip / (norm + 1e-6);
  return coef < 1.0 ? float(coef) : 1.0f;
}

}  // namespace tessera
