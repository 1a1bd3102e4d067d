// The model's parts (the embedding, each block, the head) and what a pass over one of them
// touches. ZeRO gathers, stages and reduces by part, and tessera-plan replays the same
// decisions from the same description (parallel/dp/zero_schedule.hpp).
#pragma once

#include <cstdint>
#include <vector>

namespace tessera {

enum class Pass { forward, backward };

// Parts are numbered 0 (embedding), 1..L (blocks), L + 1 (head: final norm, output
// projection, loss). A part a pipeline stage does not hold has no parameters there.
struct PartAccess {
  int head = 0;       // the head's index, L + 1
  bool tied = false;  // the head's projection is the token table (part 0)

  // The parts whose parameter values a pass of `part` reads. Backward of the embedding
  // reads no parameter; the head's forward reads the token table when tied.
  std::vector<int> reads(int part, Pass pass) const {
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
    return pass == Pass::backward ? std::vector<int>{part} : std::vector<int>{};
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
