#include "model/transformer.hpp"

#include <string>

#include "model/tensor_parallel.hpp"
#include "parallel/dp/grad_buckets.hpp"

namespace tessera {
namespace {
enum ScratchId { kGradA = 14, kGradB };
}

Transformer::Transformer(const ModelConfig& cfg, ParamStore& store)
    : cfg_(cfg),
      store_(store),
      embed_(store, cfg_),
      blocks_([&] {
        std::vector<std::unique_ptr<Block>> b;
        for (int64_t i = 0; i < cfg_.layers; ++i)
          b.push_back(std::make_unique<Block>(store, "layers." + std::to_string(i), cfg_));
        return b;
      }()),
      head_(store, cfg_, cfg_.tie_embeddings ? &embed_.token_table() : nullptr) {
  index_parameters(store);
}

void Transformer::index_parameters(ParamStore& store) {
  const std::vector<Param*> params = store.params();
  auto part_of = [&](const std::string& name) -> int {
    if (name.rfind("embed.", 0) == 0) return 0;
    if (name.rfind("layers.", 0) == 0) return 1 + std::stoi(name.substr(7));
    return int(cfg_.layers) + 1;
  };
  ranges_.assign(size_t(cfg_.layers + 2), {0, 0});
  for (int i = int(params.size()) - 1; i >= 0; --i) ranges_[size_t(part_of(params[size_t(i)]->name))].first = i;
  for (int i = 0; i < int(params.size()); ++i) ranges_[size_t(part_of(params[size_t(i)]->name))].second = i + 1;
}

void Transformer::grads_ready(StepContext& ctx, int part) const {
  if (ctx.grads) ctx.grads->ready(ranges_[size_t(part)].first, ranges_[size_t(part)].second);
}

std::vector<int> Transformer::reads(int part, Pass pass) const {
  if (part == 0) return pass == Pass::forward ? std::vector<int>{0} : std::vector<int>{};
  if (part == head_part() && pass == Pass::forward && cfg_.tie_embeddings) return {part, 0};
  return {part};
}

std::vector<int> Transformer::writes_grads(int part, Pass pass) const {
  if (part == head_part() && pass == Pass::forward)
    return cfg_.tie_embeddings ? std::vector<int>{part, 0} : std::vector<int>{part};
  return pass == Pass::backward ? std::vector<int>{part} : std::vector<int>{};
}

template <class Fn>
auto Transformer::around(StepContext& ctx, int part, Pass pass, Fn&& fn) {
  if (ctx.hooks) ctx.hooks->begin(part, pass, ctx.training);
  auto result = fn();
  if (pass == Pass::backward && ctx.reduce_partial_grads && ctx.par.tp.size() > 1)
    for (int i = ranges_[size_t(part)].first; i < ranges_[size_t(part)].second; ++i)
      if (Param& p = store_.param(i); p.tp_partial_grad)
        ctx.par.tp.all_reduce(p.grad.f32(), p.local.numel());
  if (ctx.hooks) ctx.hooks->end(part, pass, ctx.training);
  if (pass == Pass::backward) grads_ready(ctx, part);
  return result;
}

const float* Transformer::trunk(StepContext& ctx, const int32_t* ids) {
  const float* x = around(ctx, 0, Pass::forward, [&] { return embed_.forward(ctx, ids); });
  for (size_t l = 0; l < blocks_.size(); ++l)
    x = around(ctx, int(l) + 1, Pass::forward, [&] { return blocks_[l]->forward(ctx, x); });
  return x;
}

double Transformer::forward(StepContext& ctx, const int32_t* ids, const int32_t* targets) {
  const float* x = trunk(ctx, ids);
  return around(ctx, head_part(), Pass::forward, [&] { return head_.forward(ctx, x, targets); });
}

void Transformer::backward(StepContext& ctx) {
  const int64_t n = tp::rows(ctx, ctx.batch * cfg_.seq_len) * cfg_.d_model;
  float* grad = ctx.scratch.get(kGradA, n);
  float* next = ctx.scratch.get(kGradB, n);
  around(ctx, head_part(), Pass::backward, [&] { return (head_.backward(ctx, grad), 0); });
  for (int64_t l = cfg_.layers - 1; l >= 0; --l) {
    around(ctx, int(l) + 1, Pass::backward,
           [&] { return (blocks_[size_t(l)]->backward(ctx, grad, next), 0); });
    std::swap(grad, next);
  }
  around(ctx, 0, Pass::backward, [&] { return (embed_.backward(ctx, grad), 0); });
}

void Transformer::logits(StepContext& ctx, const int32_t* ids, float* out) {
  const float* x = trunk(ctx, ids);
  around(ctx, head_part(), Pass::forward, [&] { return (head_.logits(ctx, x, out), 0); });
}

}  // namespace tessera
