#include "io/tokenizer_byte.hpp"

#include "core/error.hpp"

namespace tessera {

std::vector<uint32_t> ByteTokenizer::encode(std::string_view text) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  return std::vector<uint32_t>(bytes, bytes + text.size());
}

std::string ByteTokenizer::decode(std::span<const uint32_t> ids) const {
  std::string text;
  text.reserve(ids.size());
  for (const uint32_t id : ids) {
    TESSERA_REQUIRE(id <= eos_id(), "byte tokenizer: token id ", id,
                    " is outside the vocabulary [0, 257); the ids come from another tokenizer");
    if (id == eos_id())
      text += "<|endoftext|>";
    else
      text.push_back(char(id));
  }
  return text;
}

}  // namespace tessera
