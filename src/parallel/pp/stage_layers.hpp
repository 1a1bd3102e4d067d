// Which layers each pipeline stage runs: the model's L blocks are cut into C = v p
// consecutive model chunks; model chunk c lives on stage c % p as local chunk c / p
// (schedule.hpp). Stage 0's first chunk also runs the embedding, stage p-1's last chunk the
// final norm and head.
#pragma once

#include <cstdint>
#include <vector>

namespace tessera::pp {

// One model chunk as a stage holds it: blocks [first, last) (global layer indices), plus
// the embedding before them and/or the head after them.
struct ChunkLayers {
  int64_t first = 0, last = 0;
  bool embedding = false, head = false;
};

// Layers per model chunk for L layers in C chunks: as even as possible, and where L is not a
// multiple of C the extra layers go to the middle chunks, away from the first chunk (which
// also runs the embedding) and the last (the head). Collective tessera::Error when a chunk
// would get no layer (L < C): "a stage left without layers".
std::vector<int64_t> chunk_sizes(int64_t layers, int model_chunks);

// The local chunks of stage `stage` of `stages` with `chunks` chunks per stage, in local
// order.
std::vector<ChunkLayers> stage_layers(int64_t layers, int stages, int chunks, int stage);

}  // namespace tessera::pp
