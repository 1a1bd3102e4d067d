// The model's shape, resolved from the deck's [model] section and checked for consistency.
#pragma once

#include <cstdint>
#include <string>

#include "config/choices.hpp"  // Arch, Recompute

namespace tessera {

struct ModelSection;
struct TrainSection;

// How this rank's layers are split by tensor parallelism (Megatron-LM): `size` ranks share
// every block's matrices, this one is number `rank`; sequence_parallel also shards the
// residual stream's tokens (norms, residual adds, dropout-free) over them.
struct TensorParallel {
  int64_t size = 1, rank = 0;
  bool sequence_parallel = false;
};

struct ModelConfig {
  Arch arch = Arch::llama;
  int64_t layers = 0, d_model = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn_hidden = 0;
  int64_t vocab = 0, vocab_padded = 0, seq_len = 0;
  float norm_eps = 1e-5f, rope_theta = 10000.0f, init_std = 0.02f;
  bool tie_embeddings = false;
  TensorParallel tp;
  // Activation recompute (train.recompute, doc/recompute.md): with full, the first
  // recompute_layers blocks of each model chunk (0: all) keep only their input.
  Recompute recompute = Recompute::none;
  int64_t recompute_layers = 0;

  static ModelConfig from(const ModelSection& m);
  // The model and how its blocks treat their activations (train.recompute*).
  static ModelConfig from(const ModelSection& m, const TrainSection& t);
  // How block `index` of its model chunk (0 = the chunk's first) treats its activations:
  // Megatron-LM's block method fully recomputes the first recompute_layers blocks of each
  // chunk (under 1F1B a stage's first blocks hold their activations longest) and keeps the
  // others'.
  Recompute block_recompute(int64_t index) const {
    if (recompute != Recompute::full) return recompute;
    return recompute_layers == 0 || index < recompute_layers ? Recompute::full : Recompute::none;
  }
  // Splits the model over tp ranks; a collective error names the dimension that does not
  // divide (heads, key/value heads, MLP width, padded vocabulary).
  void split(const TensorParallel& t);
  int64_t heads_local() const { return heads / tp.size; }
  int64_t kv_heads_local() const { return kv_heads / tp.size; }
  int64_t ffn_local() const { return ffn_hidden / tp.size; }
  int64_t vocab_local() const { return vocab_padded / tp.size; }
  const char* arch_name() const { return to_string(arch); }
  bool has_bias() const { return arch == Arch::gpt2; }
  int64_t param_count() const;  // including padding rows
};

}  // namespace tessera
