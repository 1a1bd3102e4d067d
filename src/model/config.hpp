// The model's shape, resolved from the deck and checked for consistency.
#pragma once

#include <cstdint>
#include <string>

namespace tessera {

class Deck;

enum class Arch { llama, gpt2 };

struct ModelConfig {
  Arch arch = Arch::llama;
  int64_t layers = 0, d_model = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn_hidden = 0;
  int64_t vocab = 0, vocab_padded = 0, seq_len = 0;
  float norm_eps = 1e-5f, rope_theta = 10000.0f, init_std = 0.02f;
  bool tie_embeddings = false;

  static ModelConfig from_deck(const Deck& deck);
  const char* arch_name() const { return arch == Arch::llama ? "llama" : "gpt2"; }
  bool has_bias() const { return arch == Arch::gpt2; }
  int64_t param_count() const;  // including padding rows
};

}  // namespace tessera
