// The decoder-only transformer: embedding, L blocks, output head, with explicit forward and
// backward per micro-batch slot. The same object runs every layout; parallel dimensions
// change what each layer holds and which groups it talks to, not this control flow.
#pragma once

#include <memory>
#include <vector>

#include "model/block.hpp"
#include "model/embedding.hpp"
#include "model/output_head.hpp"

namespace tessera {

class Transformer {
 public:
  Transformer(const ModelConfig& cfg, ParamStore& store);

  // ids, targets: [batch, T]; both must stay valid until backward of the same slot.
  // Returns the summed token loss of the micro-batch.
  double forward(StepContext& ctx, const int32_t* ids, const int32_t* targets);
  void backward(StepContext& ctx);
  // logits[batch, T, V] for ids (forward only).
  void logits(StepContext& ctx, const int32_t* ids, float* out);

  const ModelConfig& config() const { return cfg_; }
  // Registration-index ranges of the parts: [0] embedding, [1..L] blocks, [L+1] head.
  const std::vector<std::pair<int, int>>& parts() const { return ranges_; }
  int head_part() const { return int(cfg_.layers) + 1; }
  // The parts whose parameter values a pass of `part` reads, and whose gradients it adds to
  // (training only). The head reads the embedding table when the embeddings are tied and
  // adds the output-projection gradient during its forward.
  std::vector<int> reads(int part, Pass pass) const;
  std::vector<int> writes_grads(int part, Pass pass) const;

 private:
  const float* trunk(StepContext& ctx, const int32_t* ids);

  // Registration-index ranges [first, last) of the parameters of the embedding, each block
  // and the head: backward reports each range final as soon as its backward is done.
  void index_parameters(ParamStore& store);
  void grads_ready(StepContext& ctx, int part) const;
  // Runs fn as pass `pass` of `part`, between the hooks' begin and end.
  template <class Fn>
  auto around(StepContext& ctx, int part, Pass pass, Fn&& fn);

  ModelConfig cfg_;
  ParamStore& store_;
  std::vector<std::pair<int, int>> ranges_;  // [0] embedding, [1..L] blocks, [L+1] head
  Embedding embed_;
  std::vector<std::unique_ptr<Block>> blocks_;
  OutputHead head_;
};

}  // namespace tessera
