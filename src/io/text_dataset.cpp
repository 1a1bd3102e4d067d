#include "io/text_dataset.hpp"

#include <fstream>
#include <iterator>

#include "core/error.hpp"
#include "core/rng.hpp"

namespace tessera {

TextDataset::TextDataset(const std::string& path, int64_t seq_len)
    : path_(path), seq_len_(seq_len) {
  std::ifstream in(path, std::ios::binary);
  TESSERA_REQUIRE(in.good(), "cannot open data file '", path,
                  "' (data.path): no such file or not readable");
  bytes_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  TESSERA_REQUIRE(int64_t(bytes_.size()) > seq_len + 1, "data file '", path, "' holds ",
                  bytes_.size(), " tokens, fewer than one sample of model.seq_len + 1 = ",
                  seq_len + 1);
}

void TextDataset::sample(uint64_t seed, uint64_t g, int32_t* out) const {
  const CounterRng rng(seed, "data.sample");
  const uint64_t starts = uint64_t(tokens() - seq_len_ - 1) + 1;
  const uint64_t start = rng.bits(g) % starts;
  for (int64_t i = 0; i <= seq_len_; ++i) out[i] = bytes_[size_t(start) + size_t(i)];
}

}  // namespace tessera
