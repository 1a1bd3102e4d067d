#include "io/tokenizer_pretokenize.hpp"

#include <cstdint>

#include "io/tokenizer_unicode.hpp"

namespace tessera {
namespace {

struct Char {
  CharClass cls;
  uint32_t len;  // bytes
};

Char char_at(std::string_view text, size_t pos) {
  const uint8_t b = uint8_t(text[pos]);
  if (b < 0x80) return {char_class(b), 1};
  const Utf8Char c = utf8_next(text, pos);
  return {char_class(c.cp), c.len};
}

// Length of a contraction ('s 't 're 've 'm 'll 'd, lower case only) at pos, or 0.
size_t contraction(std::string_view text, size_t pos) {
  if (text[pos] != '\'' || pos + 1 >= text.size()) return 0;
  const char a = text[pos + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (pos + 2 >= text.size()) return 0;
  const char b = text[pos + 2];
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// End of the run of characters of class cls starting at pos.
size_t run_end(std::string_view text, size_t pos, CharClass cls) {
  while (pos < text.size()) {
    const Char c = char_at(text, pos);
    if (c.cls != cls) break;
    pos += c.len;
  }
  return pos;
}

// Length of the match starting at pos (pos < text.size()).
size_t match(std::string_view text, size_t pos) {
  if (const size_t n = contraction(text, pos)) return n;
  const Char first = char_at(text, pos);
  // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+": an optional ASCII space, then a run of
  // one class (a space followed by another space, or by nothing, falls through to \s).
  size_t start = pos;
  Char c = first;
  if (text[pos] == ' ' && pos + 1 < text.size()) {
    c = char_at(text, pos + 1);
    start = pos + 1;
  }
  if (c.cls != CharClass::space) return run_end(text, start, c.cls) - pos;
  // "\s+(?!\S)" then "\s+": a run of spaces ending the text is one match; a longer run
  // followed by a non-space leaves its last character to start the next match; a single
  // space followed by a non-space is a match on its own.
  size_t last = pos, end = pos;
  while (end < text.size()) {
    const Char s = char_at(text, end);
    if (s.cls != CharClass::space) break;
    last = end;
    end += s.len;
  }
  if (end == text.size() || last == pos) return end - pos;
  return last - pos;
}

}  // namespace

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  pieces.reserve(text.size() / 4 + 1);
  for (size_t pos = 0; pos < text.size();) {
    const size_t n = match(text, pos);
    pieces.push_back(text.substr(pos, n));
    pos += n;
  }
  return pieces;
}

}  // namespace tessera
