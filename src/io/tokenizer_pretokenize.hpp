// GPT-2 pre-tokenisation: the text split into the successive matches of
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with JavaScript's 'u'-flag meaning of \p{L}, \p{N} and \s (tokenizer_unicode.hpp),
// implemented by hand. Every character matches some alternative, so the pieces cover the
// text exactly; BPE then runs on each piece alone.
#pragma once

#include <string_view>
#include <vector>

namespace tessera {

std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

}  // namespace tessera
