// The byte-level tokenizer: ids 0..255 are the bytes of the text, 256 is EOS.
#pragma once

#include "io/tokenizer.hpp"

namespace tessera {

class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<uint32_t> encode(std::string_view text) override;
  std::string decode(std::span<const uint32_t> ids) const override;
  uint32_t vocab_size() const override { return 257; }
  uint32_t eos_id() const override { return 256; }
  std::string kind() const override { return "byte"; }
  std::string vocab_hash() const override { return ""; }
};

}  // namespace tessera
