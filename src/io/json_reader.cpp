#include "io/json_reader.hpp"

#include <limits>

#include "io/tokenizer_unicode.hpp"

namespace tessera {
namespace {

constexpr int kMaxDepth = 256;

std::string describe(std::string_view text, size_t pos) {
  if (pos >= text.size()) return "end of text";
  const unsigned char c = text[pos];
  if (c < 0x20 || c >= 0x7F) return "byte " + std::to_string(c);
  return std::string("'") + char(c) + "'";
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

}  // namespace

void JsonReader::fail(const std::string& what) const {
  throw JsonError(what + ", found " + describe(text_, pos_), pos_);
}

void JsonReader::skip_ws() {
  while (pos_ < text_.size() &&
         (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
    ++pos_;
}

char JsonReader::peek() {
  skip_ws();
  return pos_ < text_.size() ? text_[pos_] : '\0';
}

void JsonReader::expect(char c) {
  skip_ws();
  if (pos_ >= text_.size() || text_[pos_] != c) fail(std::string("expected '") + c + "'");
  ++pos_;
}

void JsonReader::expect_end() {
  skip_ws();
  if (pos_ != text_.size()) fail("expected the end of the JSON text");
}

void JsonReader::read_object(const std::function<void(const std::string& key)>& member) {
  if (peek() != '{') fail("expected a JSON object '{'");
  ++pos_;
  if (peek() == '}') {
    ++pos_;
    return;
  }
  for (;;) {
    if (peek() != '"') fail("expected a member name (a string)");
    const std::string key = read_string();
    expect(':');
    member(key);
    if (peek() == ',') {
      ++pos_;
      continue;
    }
    expect('}');
    return;
  }
}

uint32_t JsonReader::hex4() {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i, ++pos_) {
    if (pos_ >= text_.size()) fail("expected 4 hex digits after \\u");
    const char c = text_[pos_];
    const int d = is_digit(c)              ? c - '0'
                  : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                  : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                           : -1;
    if (d < 0) fail("expected 4 hex digits after \\u");
    v = v * 16 + uint32_t(d);
  }
  return v;
}

std::string JsonReader::read_string() {
  expect('"');
  std::string out;
  for (;;) {
    const size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] != '"' && text_[pos_] != '\\' &&
           uint8_t(text_[pos_]) >= 0x20)
      ++pos_;
    out.append(text_.substr(start, pos_ - start));
    if (pos_ >= text_.size()) fail("unterminated string");
    const char c = text_[pos_];
    if (c == '"') {
      ++pos_;
      return out;
    }
    if (c != '\\') fail("unescaped control character in string");
    if (++pos_ >= text_.size()) fail("unterminated escape");
    const char e = text_[pos_++];
    switch (e) {
      case '"':
        out.push_back('"');
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '/':
        out.push_back('/');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'u': {
        char32_t cp = hex4();
        if (cp >= 0xD800 && cp <= 0xDBFF && text_.substr(pos_, 2) == "\\u") {
          const size_t save = pos_;
          pos_ += 2;
          const char32_t low = hex4();
          if (low >= 0xDC00 && low <= 0xDFFF)
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          else
            pos_ = save;  // a lone high surrogate; the next escape stands alone
        }
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
        utf8_append(out, cp);
        break;
      }
      default:
        --pos_;
        fail("invalid escape in string");
    }
  }
}

int64_t JsonReader::read_integer() {
  skip_ws();
  const size_t start = pos_;
  const bool negative = pos_ < text_.size() && text_[pos_] == '-';
  if (negative) ++pos_;
  if (pos_ >= text_.size() || !is_digit(text_[pos_])) fail("expected an integer");
  if (text_[pos_] == '0' && pos_ + 1 < text_.size() && is_digit(text_[pos_ + 1]))
    fail("leading zero in a number");
  uint64_t v = 0;
  for (; pos_ < text_.size() && is_digit(text_[pos_]); ++pos_) {
    const uint64_t d = uint64_t(text_[pos_] - '0');
    if (v > (uint64_t(std::numeric_limits<int64_t>::max()) - d) / 10) {
      pos_ = start;
      fail("integer out of range");
    }
    v = v * 10 + d;
  }
  if (pos_ < text_.size() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E'))
    fail("expected an integer");
  return negative ? -int64_t(v) : int64_t(v);
}

void JsonReader::skip_number() {
  if (text_[pos_] == '-') ++pos_;
  if (pos_ >= text_.size() || !is_digit(text_[pos_])) fail("expected a digit");
  if (text_[pos_] == '0')
    ++pos_;
  else
    while (pos_ < text_.size() && is_digit(text_[pos_])) ++pos_;
  if (pos_ < text_.size() && text_[pos_] == '.') {
    ++pos_;
    if (pos_ >= text_.size() || !is_digit(text_[pos_])) fail("expected a digit after '.'");
    while (pos_ < text_.size() && is_digit(text_[pos_])) ++pos_;
  }
  if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
    ++pos_;
    if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
    if (pos_ >= text_.size() || !is_digit(text_[pos_])) fail("expected an exponent");
    while (pos_ < text_.size() && is_digit(text_[pos_])) ++pos_;
  }
}

void JsonReader::skip_literal(std::string_view word) {
  if (text_.substr(pos_, word.size()) != word) fail("expected a JSON value");
  pos_ += word.size();
}

void JsonReader::skip_value() {
  skip_value(0);
}

void JsonReader::skip_value(int depth) {
  if (depth > kMaxDepth) fail("JSON nested deeper than " + std::to_string(kMaxDepth));
  const char c = peek();
  if (c == '"') {
    read_string();
  } else if (c == '{') {
    read_object([&](const std::string&) { skip_value(depth + 1); });
  } else if (c == '[') {
    ++pos_;
    if (peek() == ']') {
      ++pos_;
      return;
    }
    for (;;) {
      skip_value(depth + 1);
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect(']');
      return;
    }
  } else if (c == '-' || is_digit(c)) {
    skip_number();
  } else if (c == 't') {
    skip_literal("true");
  } else if (c == 'f') {
    skip_literal("false");
  } else if (c == 'n') {
    skip_literal("null");
  } else {
    fail("expected a JSON value");
  }
}

}  // namespace tessera
