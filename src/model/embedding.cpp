#include "model/embedding.hpp"

#include "kernels/kernels.hpp"

namespace tessera {

Embedding::Embedding(ParamStore& store, const ModelConfig& cfg) : cfg_(cfg) {
  tok_ = &store.add("embed.tok.weight", Shape{cfg.vocab_padded, cfg.d_model},
                    {ParamInit::normal, cfg.init_std, cfg.vocab}, false);
  if (cfg.arch == Arch::gpt2)
    pos_ = &store.add("embed.pos.weight", Shape{cfg.seq_len, cfg.d_model},
                      {ParamInit::normal, cfg.init_std}, false);
}

const float* Embedding::forward(StepContext& ctx, const int32_t* ids) {
  const int64_t T = cfg_.seq_len, N = ctx.batch * T, C = cfg_.d_model;
  Saved& s = slots_.at(ctx.slot);
  if (s.x.numel() != N * C) s.x = Buffer(ctx.alloc, Shape{N, C}, DType::f32, Charge::activations);
  s.ids = ids;
  kernels::embedding_forward(ids, tok_->value.f32(), s.x.f32(), N, C);
  if (pos_)
    for (int64_t b = 0; b < ctx.batch; ++b)
      kernels::add_inplace(s.x.f32() + b * T * C, pos_->value.f32(), T * C);
  return s.x.f32();
}

void Embedding::backward(StepContext& ctx, const float* dx) {
  const int64_t T = cfg_.seq_len, N = ctx.batch * T, C = cfg_.d_model;
  Saved& s = slots_.at(ctx.slot);
  kernels::embedding_backward(s.ids, dx, tok_->grad.f32(), N, C);
  if (pos_)
    for (int64_t b = 0; b < ctx.batch; ++b)
      kernels::add_inplace(pos_->grad.f32(), dx + b * T * C, T * C);
}

}  // namespace tessera
