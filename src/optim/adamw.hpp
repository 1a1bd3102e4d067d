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

// Updates the elements [begin, end) of the store's flat parameter buffer: all of it, or
// this rank's shard under ZeRO (moments are held for the range only).
class AdamW {
 public:
  AdamW(ParamStore& store, Allocator& alloc, AdamWConfig cfg, int64_t begin, int64_t end);

  // One update with learning rate lr; step is 1-based. grads holds the gradients of the
  // range [begin, end), used multiplied by grad_scale (the clipping factor).
  void step(double lr, int64_t step, const float* grads, float grad_scale = 1.0f);
  bool decays(const Param& p) const;

  // Moments of the range; element i of the flat buffer is at m()[i - begin()].
  float* m() const { return m_.f32(); }
  float* v() const { return v_.f32(); }
  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }

 private:
  ParamStore& store_;
  AdamWConfig cfg_;
  int64_t begin_, end_;
  Buffer m_, v_;
};

// The factor that brings the gradient norm down to clip (torch.nn.utils.clip_grad_norm_'s
// rule: clip / (norm + 1e-6) when that is below 1); 1 when clip <= 0.
float clip_factor(double norm, double clip);

}  // namespace tessera
