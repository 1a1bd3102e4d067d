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
#include "model/weight_grads.hpp"

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

  // ids, targets: i32 [batch, T]; both must stay valid until backward of the same slot.
  // Returns the summed token loss of the micro-batch.
  double forward(StepContext& ctx, const Tensor& ids, const Tensor& targets);
  void backward(StepContext& ctx);
  // out[batch * T, V] = the logits for ids (forward only).
  void logits(StepContext& ctx, const Tensor& ids, const Tensor& out);

  // Forward of local chunk k: from ids when the chunk has the embedding, else from x
  // ([rows, C], valid until backward of the same slot). Returns the chunk's output [rows, C]
  // (owned by the slot), or an empty Tensor for a chunk with the head, which adds the summed
  // token loss to *loss.
  Tensor forward_chunk(StepContext& ctx, int k, const Tensor& ids, Tensor x, const Tensor& targets,
                       double* loss);
  // Backward of local chunk k from dy ([rows, C], the gradient of its output; ignored for the
  // head chunk). Returns the gradient of its input [rows, C] (scratch, valid until the next
  // call), or an empty Tensor for the chunk with the embedding.
  Tensor backward_chunk(StepContext& ctx, int k, const Tensor& dy);
  // A split backward (split_backward(true); doc/pipeline.md, "Split backward"): the same
  // input gradient as backward_chunk, with every weight-gradient GEMM queued in a set of
  // weight_grads() whose index *set receives; then backward_weight_chunk runs that set's GEMMs
  // part by part (the head, the blocks in reverse, the embedding), each between its
  // Pass::weight hooks, and frees the set.
  Tensor backward_input_chunk(StepContext& ctx, int k, const Tensor& dy, int* set);
  void backward_weight_chunk(StepContext& ctx, int k, int set);
  // Whether backward runs as backward_input_chunk + backward_weight_chunk (set before the
  // data-parallel strategy reads access()).
  void split_backward(bool on) { split_ = on; }
  const WeightGrads& weight_grads() const { return weight_grads_; }
  const std::vector<ChunkLayers>& chunks() const { return chunks_; }
  // This stage's own copy of the tied token table (null unless it has one).
  Param* tied_copy() const { return tied_copy_; }

  const ModelConfig& config() const { return cfg_; }
  // This rank's mixture-of-experts layers, in layer order.
  std::vector<Moe*> moe_layers() const;
  // The mixture of experts of global layer `layer`; null when this rank does not hold that
  // block or the block has a dense MLP.
  const Moe* moe_at(int64_t layer) const;
  // Registration-index ranges of the parts: [0] embedding, [1..L] blocks, [L+1] head.
  const std::vector<std::pair<int, int>>& parts() const { return ranges_; }
  int head_part() const { return int(cfg_.layers) + 1; }
  // What a pass over each part reads and adds gradients to.
  PartAccess access() const { return {head_part(), cfg_.tie_embeddings, split_}; }

 private:
  Tensor trunk(StepContext& ctx, const Tensor& ids);

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
  std::unique_ptr<Block::Rebuilt> rebuilt_;     // what recompute rebuilds, for every block
  std::vector<std::unique_ptr<Block>> blocks_;  // by global layer; null where not held
  Param* tied_copy_ = nullptr;
  std::unique_ptr<OutputHead> head_;           // null on a stage without the head
  bool split_ = false;
  WeightGrads weight_grads_;
};

}  // namespace tessera
