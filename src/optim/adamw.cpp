#include "optim/adamw.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/kernels.hpp"

namespace tessera {

namespace {
int64_t local_extent(const std::vector<ShardSegment>& segments) {
  int64_t n = 0;
  for (const ShardSegment& s : segments) n = std::max(n, s.local + s.n);
  return n;
}
}  // namespace

AdamW::AdamW(ParamStore& store, Allocator& alloc, AdamWConfig cfg,
             std::vector<ShardSegment> segments)
    : store_(store),
      cfg_(cfg),
      segments_(std::move(segments)),
      m_(alloc, Shape{local_extent(segments_)}, DType::f32, Charge::optimizer),
      v_(alloc, Shape{local_extent(segments_)}, DType::f32, Charge::optimizer) {}

bool AdamW::decays(const Param& p) const {
  return p.decay || (cfg_.decay_embeddings && p.name.rfind("embed.", 0) == 0);
}

void AdamW::step(double lr, int64_t step, float* values, Index index, const float* grads,
                 float grad_scale, const Tensor& compute) {
  for (Param* p : store_.params()) {
    const kernels::AdamWArgs args{float(lr), cfg_.beta1, cfg_.beta2, cfg_.eps,
                                  decays(*p) ? cfg_.weight_decay : 0.0f, step, grad_scale};
    for (const ShardSegment& s : segments_) {
      // The piece of this parameter inside the segment.
      const int64_t a = std::max(s.global, p->offset);
      const int64_t b = std::min(s.global + s.n, p->offset + p->local.numel());
      if (a >= b) continue;
      const int64_t l = s.local + (a - s.global);
      const int64_t n = b - a;
      const Space space = m_.view().space;  // the values and gradients are in the same one
      const int64_t at = index == Index::global ? a : l;
      kernels::adamw(view_of(values + at, {n}, space), view_of(grads + l, {n}, space),
                     m_.view().slice(l, n), v_.view().slice(l, n), n, args,
                     compute.data ? compute.slice(at, n) : Tensor{});
    }
  }
}

GradSquares grad_squares(ParamStore& store, const std::vector<ShardSegment>& segments,
                         const float* grads, const Param* skip) {
  GradSquares sq;
  for (Param* p : store.params())
    for (const ShardSegment& s : segments) {
      const int64_t a = std::max(s.global, p->offset);
      const int64_t b = std::min(s.global + s.n, p->offset + p->local.numel());
      if (a >= b || p == skip) continue;
      double& into = p->expert ? sq.expert : p->tp.split() ? sq.split : sq.replicated;
      into += kernels::sum_squares(
          view_of(grads + s.local + (a - s.global), {b - a}, store.space()), b - a);
    }
  return sq;
}

float clip_factor(double norm, double clip) {
  if (clip <= 0) return 1.0f;
  const double coef = clip / (norm + 1e-6);
  return coef < 1.0 ? float(coef) : 1.0f;
}

}  // namespace tessera
