// The decoder-only transformer: embedding, L blocks, output head, with explicit forward and
// backward per micro-batch slot. The same object runs every layout; parallel dimensions
// change what each layer holds and which groups it talks to, not this control flow.
#pragma once

#include <memory>
#include <vector>

#include "model/block.hpp"
#include "model/embedding.hpp"
#include "model/output_head.hpp"
#include "model/parts.hpp"

namespace tessera {

class Transformer {
 public:
  // The whole model: one chunk with the embedding, every block and the head.
  Transformer(const ModelConfig& cfg, ParamStore& store);
  // A pipeline stage's part of the model: its local chunks (blocks named by their global
  // layer index). A stage with the head but not the embedding of a model with tied
  // embeddings registers its own copy of embed.tok.weight (initialised like the original;
  // the trainer keeps the two copies' gradients summed).
  Transformer(const ModelConfig& cfg, ParamStore& store, std::vector<ChunkLayers> chunks);

  // ids, targets: [batch, T]; both must stay valid until backward of the same slot.
  // Returns the summed token loss of the micro-batch.
  double forward(StepContext& ctx, const int32_t* ids, const int32_t* targets);
  void backward(StepContext& ctx);
  // logits[batch, T, V] for ids (forward only).
  void logits(StepContext& ctx, const int32_t* ids, float* out);

  // Forward of local chunk k: from ids when the chunk has the embedding, else from x
  // ([rows, C], valid until backward of the same slot). Returns the chunk's output (owned by
  // the slot), or null for a chunk with the head, which adds the summed token loss to *loss.
  const float* forward_chunk(StepContext& ctx, int k, const int32_t* ids, const float* x,
                             const int32_t* targets, double* loss);
  // Backward of local chunk k from dy (the gradient of its output; ignored for the head
  // chunk). Returns the gradient of its input (scratch, valid until the next call), or null
  // for the chunk with the embedding.
  const float* backward_chunk(StepContext& ctx, int k, const float* dy);
  const std::vector<ChunkLayers>& chunks() const { return chunks_; }
  // This stage's own copy of the tied token table (null unless it has one).
  Param* tied_copy() const { return tied_copy_; }

  const ModelConfig& config() const { return cfg_; }
  // Registration-index ranges of the parts: [0] embedding, [1..L] blocks, [L+1] head.
  const std::vector<std::pair<int, int>>& parts() const { return ranges_; }
  int head_part() const { return int(cfg_.layers) + 1; }
  // What a pass over each part reads and adds gradients to.
  PartAccess access() const { return {head_part(), cfg_.tie_embeddings}; }

 private:
  const float* trunk(StepContext& ctx, const int32_t* ids);

  // Registration-index ranges [first, last) of the parameters of the embedding, each block
  // and the head: backward reports each range final as soon as its backward is done.
  void index_parameters(ParamStore& store);
  // Runs fn as pass `pass` of `part`, between the hooks' begin and end.
  template <class Fn>
  auto around(StepContext& ctx, int part, Pass pass, Fn&& fn);

  ModelConfig cfg_;
  ParamStore& store_;
  std::vector<std::pair<int, int>> ranges_;  // [0] embedding, [1..L] blocks, [L+1] head
  std::vector<ChunkLayers> chunks_;
  std::unique_ptr<Embedding> embed_;           // null on a stage without the embedding
  std::vector<std::unique_ptr<Block>> blocks_;  // by global layer; null where not held
  Param* tied_copy_ = nullptr;
  std::unique_ptr<OutputHead> head_;           // null on a stage without the head
};

}  // namespace tessera
