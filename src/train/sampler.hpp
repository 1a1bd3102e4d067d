// Autoregressive sampling from a trained model: temperature and top-k over the next-token
// distribution, drawn from the counter-based RNG so a (seed, prompt) pair always gives the
// same text.
#pragma once

#include <cstdint>
#include <vector>

#include "model/transformer.hpp"

namespace tessera {

struct SampleOptions {
  int64_t length = 200;
  double temperature = 0.8;
  int64_t top_k = 40;
  uint64_t seed = 0;
  int64_t stop_id = -1;  // stop early at this id (EOS), -1: never
};

// Returns the generated ids (prompt excluded). The context is the last seq_len tokens.
std::vector<int32_t> generate(Transformer& model, StepContext ctx, std::vector<int32_t> prompt,
                              const SampleOptions& opt);

}  // namespace tessera
