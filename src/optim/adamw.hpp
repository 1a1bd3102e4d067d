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

// Elements [global, global + n) of the store's flat buffers, held at [local, local + n) of
// this rank's compact arrays (moments, reduced gradients, and ZeRO-3's parameter shard).
struct ShardSegment {
  int64_t global = 0, local = 0, n = 0;
};

// Updates the elements the segments name: the whole flat buffer, or this rank's shard of
// every part under ZeRO. Moments are held for those elements only.
class AdamW {
 public:
  AdamW(ParamStore& store, Allocator& alloc, AdamWConfig cfg, std::vector<ShardSegment> segments);

  // One update with learning rate lr; step is 1-based. grads holds the gradients indexed
  // locally, used multiplied by grad_scale (the clipping factor). values is indexed
  // globally (the store's flat buffer) or locally (a ZeRO-3 shard).
  // compute: null, or the 16-bit compute copy indexed as values, written in the same pass.
  enum class Index { global, local };
  void step(double lr, int64_t step, float* values, Index index, const float* grads,
            float grad_scale = 1.0f, const Tensor& compute = {});
  bool decays(const Param& p) const;

  const std::vector<ShardSegment>& segments() const { return segments_; }
  // Moments, indexed locally.
  float* m() const { return m_.ptr_f32(); }  // any space (the checkpoint stages them)
  float* v() const { return v_.ptr_f32(); }
  int64_t local_size() const { return m_.numel(); }

 private:
  ParamStore& store_;
  AdamWConfig cfg_;
  std::vector<ShardSegment> segments_;
  Buffer m_, v_;
};

// Sum of squares of the gradients the segments hold (indexed locally), split into those of
// parameters split over tensor-parallel ranks (to be summed over them) and of parameters
// every tensor-parallel rank holds whole (counted once). `skip` (a pipeline stage's copy of a
// tied table, counted where the table itself is) is left out. Routed experts held for this
// rank's expert-parallel group only (Param::expert) are apart: to be summed over the ep group.
struct GradSquares {
  double split = 0, replicated = 0, expert = 0;
};
GradSquares grad_squares(ParamStore& store, const std::vector<ShardSegment>& segments,
                         const float* grads, const Param* skip = nullptr);

// The factor that brings the gradient norm down to clip (torch.nn.utils.clip_grad_norm_'s
// rule: clip / (norm + 1e-6) when that is below 1); 1 when clip <= 0.
float clip_factor(double norm, double clip);

}  // namespace tessera
