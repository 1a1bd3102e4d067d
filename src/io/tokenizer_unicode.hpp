// Unicode character classes of the GPT-2 pre-tokenisation pattern: \p{L} (letter), \p{N}
// (number) and \s (space), as JavaScript's RegExp with the 'u' flag defines them, and a
// UTF-8 decoder that never fails (a malformed byte is one character of class other).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace tessera {

enum class CharClass : uint8_t { other, letter, number, space };

struct UnicodeRange {
  char32_t first, last;
  CharClass cls;
};

// Sorted, disjoint ranges of every non-"other" code point (tokenizer_unicode_table.cpp,
// generated from node's RegExp engine by tests/tokenizer/make_unicode_table.js).
std::span<const UnicodeRange> unicode_ranges();

CharClass char_class(char32_t cp);

// The code point starting at text[pos] and its length in bytes (1 to 4). A byte that does
// not start a well-formed UTF-8 sequence (stray continuation, overlong form, surrogate,
// > U+10FFFF, truncated sequence) is returned alone as 0xFFFFFFFF, length 1.
struct Utf8Char {
  char32_t cp;
  uint32_t len;
};
Utf8Char utf8_next(std::string_view text, size_t pos);

// Appends the UTF-8 encoding of cp (a scalar value) to out.
template <class String>
void utf8_append(String& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

}  // namespace tessera
