// Prints the token ids of a file encoded as one string, one per line: the tessera side of
// the comparison with the reference JavaScript encoder (compare_ids.sh).
// usage: tessera_tokenizer_encode byte|gpt2 VOCAB_DIR FILE
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.hpp"
#include "io/tokenizer.hpp"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fputs("usage: tessera_tokenizer_encode byte|gpt2 VOCAB_DIR FILE\n", stderr);
    return 2;
  }
  try {
    const auto tokenizer = tessera::make_tokenizer(argv[1], argv[2]);
    std::ifstream in(argv[3], std::ios::binary);
    TESSERA_REQUIRE(in.good(), "cannot open '", argv[3], "'");
    std::ostringstream text;
    text << in.rdbuf();
    std::string out;
    for (const uint32_t id : tokenizer->encode(text.str())) out += std::to_string(id) + "\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera_tokenizer_encode: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
