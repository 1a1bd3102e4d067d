// Which layers each pipeline stage runs: the model's L blocks are cut into C = v p
// consecutive model chunks, placed on the stages as the schedule's kind says (schedule.hpp:
// chunk c on stage c % p as local chunk c / p, or in a V). Model chunk 0 also runs the
// embedding, model chunk C-1 the final norm and head: with round-robin placement stage 0's
// first chunk and stage p-1's last; in a V both are stage 0's (local chunks 0 and 1).
//
// How the L blocks are cut (parallel.pp_layers):
//   balanced  by cost, the embedding and the head counted (the default): the cut that
//             minimises the most expensive chunk, ties broken towards equal chunks; a head
//             over a large vocabulary leaves the last chunk fewer blocks (Megatron-LM's
//             account-for-embedding/loss options do this by counting each as one layer);
//   even      L / C blocks each; L must be a multiple of C;
//   a,b,...   C numbers, the blocks of each model chunk in order (they sum to L).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "model/config.hpp"
#include "model/parts.hpp"
#include "parallel/pp/schedule.hpp"

namespace tessera::pp {

using ChunkLayers = tessera::ChunkLayers;  // the model's own description (model/parts.hpp)

// Training FLOPs per token of the embedding (0: a lookup), one block and the head (final
// norm, output projection over the padded vocabulary, cross-entropy): perf/flops.hpp's
// accounting, per layer.
struct ChunkCosts {
  double embedding = 0, block = 1, head = 0;
};
ChunkCosts chunk_costs(const ModelConfig& cfg);

// The balanced cut of `layers` blocks into `model_chunks` chunks of at least one block.
std::vector<int64_t> balanced_chunk_sizes(int64_t layers, int model_chunks, const ChunkCosts& cost);

// Blocks per model chunk as parallel.pp_layers says; a collective tessera::Error, before
// any work, for a cut that leaves a chunk without blocks ("a stage left without layers"),
// an even cut that does not divide, or a list of the wrong length or sum.
std::vector<int64_t> split_layers(const ModelConfig& cfg, int model_chunks, std::string_view spec);

// The local chunks of stage `stage`, in local order, for blocks per model chunk `sizes`
// (sizes.size() = shape.model_chunks()), placed as shape's kind places them.
std::vector<ChunkLayers> stage_layers(const std::vector<int64_t>& sizes, const ScheduleShape& shape,
                                      int stage);

}  // namespace tessera::pp
