// The model's parts (the embedding, each block, the head) and what a pass over one of them
// touches. ZeRO gathers, stages and reduces by part, and tessera-plan replays the same
// decisions from the same description (parallel/dp/zero_schedule.hpp).
#pragma once

#include <cstdint>
#include <vector>

namespace tessera {

// A fused backward computes a part's input gradient and its parameters' gradients in one
// pass. A pipeline schedule that splits the backward (zb-h1, zb-v, dualpipev) runs it as
// backward (B: the input gradient, and the gradients that cost no GEMM: norms, biases, the
// embedding) and later weight (W: the weight-gradient GEMMs B queued, model/weight_grads.hpp),
// which reads no parameter value.
enum class Pass { forward, backward, weight };

// Parts are numbered 0 (embedding), 1..L (blocks), L + 1 (head: final norm, output
// projection, loss). A part a pipeline stage does not hold has no parameters there.
struct PartAccess {
  int head = 0;        // the head's index, L + 1
  bool tied = false;   // the head's projection is the token table (part 0)
  bool split = false;  // backward runs as backward then weight (Pass)

  // The pass after which a micro-batch's gradients of a part are complete.
  Pass final_pass() const { return split ? Pass::weight : Pass::backward; }

  // The parts whose parameter values a pass of `part` reads. Backward of the embedding
  // reads no parameter; the head's forward reads the token table when tied.
  std::vector<int> reads(int part, Pass pass) const {
    if (pass == Pass::weight) return {};
    if (part == 0) return pass == Pass::forward ? std::vector<int>{0} : std::vector<int>{};
    if (part == head && pass == Pass::forward && tied) return {part, 0};
    return {part};
  }
  // The parts whose gradients a training pass of `part` adds to. The head's forward computes
  // its own gradients (cross-entropy fused with the projection's backward), the table's too
  // when tied.
  std::vector<int> writes_grads(int part, Pass pass) const {
    if (part == head && pass == Pass::forward)
      return tied ? std::vector<int>{part, 0} : std::vector<int>{part};
    return pass != Pass::forward ? std::vector<int>{part} : std::vector<int>{};
  }
};

// One model chunk as a pipeline stage holds it: blocks [first, last) (global layer indices),
// plus the embedding before them and/or the head after them (parallel/pp/stage_layers.hpp
// cuts the model; the whole model is one chunk with both).
struct ChunkLayers {
  int64_t first = 0, last = 0;
  bool embedding = false, head = false;
};

}  // namespace tessera
