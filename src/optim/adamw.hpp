// AdamW over a ParamStore: fp32 moments charged to the optimizer category, per-parameter
// weight-decay flags, global-norm clipping.
#pragma once

#include <vector>

#include "model/param.hpp"

namespace tessera {

struct AdamWConfig {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  bool decay_embeddings = false;
};

class AdamW {
 public:
  AdamW(ParamStore& store, Allocator& alloc, AdamWConfig cfg);

  // One update with learning rate lr; step is 1-based. Gradients are used multiplied by
  // grad_scale (the clipping factor), without a separate pass over them.
  void step(double lr, int64_t step, float grad_scale = 1.0f);
  bool decays(const Param& p) const;

  float* m() const { return m_.f32(); }
  float* v() const { return v_.f32(); }

 private:
  ParamStore& store_;
  AdamWConfig cfg_;
  Buffer m_, v_;
};

// L2 norm of all gradients in the store (fp64 accumulation).
double grad_norm(const ParamStore& store);
// The factor that brings the gradient norm down to clip (torch.nn.utils.clip_grad_norm_'s
// rule: clip / (norm + 1e-6) when that is below 1); 1 when clip <= 0.
float clip_factor(double norm, double clip);

}  // namespace tessera
