#include "model/transformer.hpp"

#include <string>

namespace tessera {
namespace {
enum ScratchId { kGradA = 14, kGradB };
}

Transformer::Transformer(const ModelConfig& cfg, ParamStore& store)
    : cfg_(cfg),
      embed_(store, cfg_),
      blocks_([&] {
        std::vector<std::unique_ptr<Block>> b;
        for (int64_t i = 0; i < cfg_.layers; ++i)
          b.push_back(std::make_unique<Block>(store, "layers." + std::to_string(i), cfg_));
        return b;
      }()),
      head_(store, cfg_, cfg_.tie_embeddings ? &embed_.token_table() : nullptr) {}

const float* Transformer::trunk(StepContext& ctx, const int32_t* ids) {
  const float* x = embed_.forward(ctx, ids);
  for (auto& block : blocks_) x = block->forward(ctx, x);
  return x;
}

double Transformer::forward(StepContext& ctx, const int32_t* ids, const int32_t* targets) {
  return head_.forward(ctx, trunk(ctx, ids), targets);
}

void Transformer::backward(StepContext& ctx) {
  const int64_t n = ctx.batch * cfg_.seq_len * cfg_.d_model;
  float* grad = ctx.scratch.get(kGradA, n);
  float* next = ctx.scratch.get(kGradB, n);
  head_.backward(ctx, grad);
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) {
    (*it)->backward(ctx, grad, next);
    std::swap(grad, next);
  }
  embed_.backward(ctx, grad);
}

void Transformer::logits(StepContext& ctx, const int32_t* ids, float* out) {
  head_.logits(ctx, trunk(ctx, ids), out);
}

}  // namespace tessera
