#include "io/tokenizer.hpp"

#include "core/error.hpp"
#include "io/tokenizer_byte.hpp"
#include "io/tokenizer_gpt2.hpp"

namespace tessera {

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& vocab_dir) {
  if (kind == "byte") return std::make_unique<ByteTokenizer>();
  if (kind == "gpt2") {
    TESSERA_REQUIRE(!vocab_dir.empty(),
                    "the gpt2 tokenizer needs a vocabulary directory holding encoder.json and "
                    "vocab.bpe; fetch them with tools/fetch-gpt2-vocab DIR and pass that DIR");
    return std::make_unique<Gpt2Tokenizer>(vocab_dir);
  }
  TESSERA_REQUIRE(false, "unknown tokenizer '", kind, "'; allowed: byte, gpt2");
  return nullptr;
}

}  // namespace tessera
