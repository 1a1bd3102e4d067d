#include "parallel/pp/stage_layers.hpp"

#include "core/error.hpp"

namespace tessera::pp {

std::vector<int64_t> chunk_sizes(int64_t layers, int model_chunks) {
  const int64_t C = model_chunks;
  TESSERA_REQUIRE(layers >= C, "pipeline: model.layers = ", layers, " cannot be cut into ", C,
                  " model chunks (parallel.pp x parallel.pp_virtual): a stage would be left "
                  "without layers; use at least ", C, " layers, or fewer stages or chunks");
  std::vector<int64_t> size(size_t(C), layers / C);
  int64_t extra = layers % C;
  // Hand the remainder out from the middle outwards: chunk C/2, then its neighbours.
  for (int64_t k = 0; extra > 0; ++k) {
    const int64_t c = C / 2 + (k % 2 ? -(k + 1) / 2 : k / 2);
    if (c < 0 || c >= C) continue;
    ++size[size_t(c)];
    --extra;
  }
  return size;
}

std::vector<ChunkLayers> stage_layers(int64_t layers, int stages, int chunks, int stage) {
  const int C = stages * chunks;
  const std::vector<int64_t> size = chunk_sizes(layers, C);
  std::vector<ChunkLayers> out;
  int64_t first = 0;
  for (int c = 0; c < C; ++c) {
    if (c % stages == stage)
      out.push_back({first, first + size[size_t(c)], c == 0, c == C - 1});
    first += size[size_t(c)];
  }
  return out;
}

}  // namespace tessera::pp
