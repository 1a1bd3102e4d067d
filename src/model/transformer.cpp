#include "model/transformer.hpp"

#include <algorithm>
#include <string>

#include "kernels/kernels.hpp"
#include "model/pass_pair.hpp"
#include "model/tensor_parallel.hpp"

namespace tessera {
Transformer::Transformer(const ModelConfig& cfg, ParamStore& store)
    : Transformer(cfg, store, {ChunkLayers{0, cfg.layers, true, true}}) {}

Transformer::Transformer(const ModelConfig& cfg, ParamStore& store,
                         std::vector<ChunkLayers> chunks)
    : cfg_(cfg), store_(store), chunks_(std::move(chunks)) {
  // Registration order: embedding (or the tied copy), blocks in layer order, head.
  bool has_embedding = false, has_head = false;
  for (const ChunkLayers& c : chunks_) has_embedding |= c.embedding, has_head |= c.head;
  if (has_embedding) embed_ = std::make_unique<Embedding>(store, cfg_);
  else if (has_head && cfg_.tie_embeddings) tied_copy_ = &Embedding::add_token_table(store, cfg_);
  blocks_.resize(size_t(cfg_.layers));
  rebuilt_ = std::make_unique<Block::Rebuilt>();
  for (const ChunkLayers& c : chunks_)
    for (int64_t i = c.first; i < c.last; ++i)
      blocks_[size_t(i)] = std::make_unique<Block>(store, "layers." + std::to_string(i), cfg_,
                                                   cfg_.block_recompute(i - c.first), rebuilt_.get(),
                                                   cfg_.moe.is_moe(i));
  if (has_head) {
    Param* tied = !cfg_.tie_embeddings ? nullptr : embed_ ? &embed_->token_table() : tied_copy_;
    head_ = std::make_unique<OutputHead>(store, cfg_, tied);
  }
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

template <class Fn>
auto Transformer::around(StepContext& ctx, int part, Pass pass, Fn&& fn) {
  if (ctx.hooks) ctx.hooks->begin(part, pass, ctx.training);
  if (ctx.weight_grads) ctx.weight_grads->set_part(part);
  auto result = fn();
  // Partial (sequence-parallel) gradients are summed once the micro-batch's are complete.
  if (pass == access().final_pass() && ctx.reduce_partial_grads && ctx.par.tp.size() > 1)
    for (int i = ranges_[size_t(part)].first; i < ranges_[size_t(part)].second; ++i)
      if (Param& p = store_.param(i); p.tp_partial_grad)
        ctx.par.tp.all_reduce(p.grad.slice(0, p.local.numel()));
  if (ctx.hooks) ctx.hooks->end(part, pass, ctx.training);
  return result;
}

Tensor Transformer::trunk(StepContext& ctx, const Tensor& ids) {
  Tensor x = around(ctx, 0, Pass::forward, [&] { return embed_->forward(ctx, ids); });
  for (size_t l = 0; l < blocks_.size(); ++l)
    x = around(ctx, int(l) + 1, Pass::forward, [&] { return blocks_[l]->forward(ctx, x); });
  return x;
}

Tensor Transformer::forward_chunk(StepContext& ctx, int k, const Tensor& ids, Tensor x,
                                  const Tensor& targets, double* loss) {
  const ChunkLayers& c = chunks_[size_t(k)];
  if (c.embedding) x = around(ctx, 0, Pass::forward, [&] { return embed_->forward(ctx, ids); });
  for (int64_t l = c.first; l < c.last; ++l)
    x = around(ctx, int(l) + 1, Pass::forward,
               [&] { return blocks_[size_t(l)]->forward(ctx, x); });
  if (!c.head) return x;
  *loss += around(ctx, head_part(), Pass::forward, [&] { return head_->forward(ctx, x, targets); });
  return Tensor{};
}

Tensor Transformer::backward_chunk(StepContext& ctx, int k, const Tensor& dy) {
  const ChunkLayers& c = chunks_[size_t(k)];
  const int64_t R = tp::rows(ctx, ctx.batch * cfg_.seq_local()), C = cfg_.d_model;
  Tensor grad = ctx.scratch.get(ScratchId::grad_a, {R, C});
  Tensor next = ctx.scratch.get(ScratchId::grad_b, {R, C});
  if (c.head) around(ctx, head_part(), Pass::backward, [&] { return (head_->backward(ctx, grad), 0); });
  else
    kernels::copy(dy, grad, R * C);
  for (int64_t l = c.last - 1; l >= c.first; --l) {
    around(ctx, int(l) + 1, Pass::backward,
           [&] { return (blocks_[size_t(l)]->backward(ctx, grad, next), 0); });
    std::swap(grad, next);
  }
  if (!c.embedding) return grad;
  // In a pair (model/pass_pair.hpp) the other pass is a forward, whose head adds its weight
  // gradient into a tied token table's: it ends first, as when the passes run in turn.
  if (ctx.pair && cfg_.tie_embeddings) ctx.pair->let_other_finish();
  around(ctx, 0, Pass::backward, [&] { return (embed_->backward(ctx, grad), 0); });
  return Tensor{};
}

Tensor Transformer::backward_input_chunk(StepContext& ctx, int k, const Tensor& dy, int* set) {
  *set = weight_grads_.open();
  ctx.weight_grads = &weight_grads_;
  const Tensor dx = backward_chunk(ctx, k, dy);
  ctx.weight_grads = nullptr;
  weight_grads_.close();
  return dx;
}

void Transformer::backward_weight_chunk(StepContext& ctx, int k, int set) {
  const ChunkLayers& c = chunks_[size_t(k)];
  auto run = [&](int part) {
    around(ctx, part, Pass::weight, [&] { return (weight_grads_.run(set, part), 0); });
  };
  if (c.head) run(head_part());
  for (int64_t l = c.last - 1; l >= c.first; --l) run(int(l) + 1);
  if (c.embedding) run(0);
  weight_grads_.release(set);
}

std::vector<Moe*> Transformer::moe_layers() const {
  std::vector<Moe*> out;
  for (const std::unique_ptr<Block>& b : blocks_)
    if (b && b->moe()) out.push_back(b->moe());
  return out;
}

const Moe* Transformer::moe_at(int64_t layer) const {
  const std::unique_ptr<Block>& b = blocks_[size_t(layer)];
  return b ? b->moe() : nullptr;
}

double Transformer::forward(StepContext& ctx, const Tensor& ids, const Tensor& targets) {
  double loss = 0;
  forward_chunk(ctx, 0, ids, Tensor{}, targets, &loss);
  return loss;
}

void Transformer::backward(StepContext& ctx) {
  backward_chunk(ctx, 0, Tensor{});
}

void Transformer::logits(StepContext& ctx, const Tensor& ids, const Tensor& out) {
  const Tensor x = trunk(ctx, ids);
  around(ctx, head_part(), Pass::forward, [&] { return (head_->logits(ctx, x, out), 0); });
}

}  // namespace tessera
