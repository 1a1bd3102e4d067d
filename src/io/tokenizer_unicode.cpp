#include "io/tokenizer_unicode.hpp"

#include <algorithm>
#include <array>

namespace tessera {
namespace {

// ASCII is most of most corpora: classify it from a 128-entry table built from the ranges.
struct AsciiClasses {
  std::array<CharClass, 128> cls{};
  AsciiClasses() {
    for (char32_t c = 0; c < 128; ++c) cls[c] = CharClass::other;
    for (const UnicodeRange& r : unicode_ranges())
      for (char32_t c = r.first; c <= r.last && c < 128; ++c) cls[c] = r.cls;
  }
};

}  // namespace

CharClass char_class(char32_t cp) {
  static const AsciiClasses ascii;
  if (cp < 128) return ascii.cls[cp];
  static const std::span<const UnicodeRange> ranges = unicode_ranges();
  const auto it = std::upper_bound(ranges.begin(), ranges.end(), cp,
                                   [](char32_t c, const UnicodeRange& r) { return c < r.first; });
  if (it == ranges.begin()) return CharClass::other;
  const UnicodeRange& r = *(it - 1);
  return cp <= r.last ? r.cls : CharClass::other;
}

Utf8Char utf8_next(std::string_view text, size_t pos) {
  const auto byte = [&](size_t i) { return uint8_t(text[i]); };
  const uint8_t b0 = byte(pos);
  if (b0 < 0x80) return {b0, 1};
  constexpr Utf8Char kBad{0xFFFFFFFF, 1};
  uint32_t len = 0;
  char32_t cp = 0, min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return kBad;
  }
  if (pos + len > text.size()) return kBad;
  for (uint32_t i = 1; i < len; ++i) {
    const uint8_t b = byte(pos + i);
    if ((b & 0xC0) != 0x80) return kBad;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return kBad;
  return {cp, len};
}

}  // namespace tessera
