// A strict, minimal JSON (RFC 8259) reader for the JSON tessera reads: the records of JSONL
// corpora and GPT-2's encoder.json. It decodes strings (every escape; \uXXXX surrogate pairs
// combined; a lone surrogate becomes U+FFFD, as JavaScript's TextEncoder writes it) and
// checks the syntax of everything else without building a tree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace tessera {

// A syntax error at byte offset() of the text.
class JsonError : public std::runtime_error {
 public:
  JsonError(const std::string& what, size_t offset) : std::runtime_error(what), offset_(offset) {}
  size_t offset() const { return offset_; }

 private:
  size_t offset_;
};

class JsonReader {
 public:
  explicit JsonReader(std::string_view text) : text_(text) {}

  // The first character of the next value ('{', '"', '[', 't', '-', '1', ...), or '\0' at
  // the end of the text.
  char peek();
  // Reads an object; for each member, calls member(key) with the reader at the member's
  // value, which member must consume (read_string, read_integer or skip_value).
  void read_object(const std::function<void(const std::string& key)>& member);
  std::string read_string();
  int64_t read_integer();
  void skip_value();
  void expect_end();  // nothing but whitespace may follow
  size_t offset() const { return pos_; }

 private:
  void skip_ws();
  [[noreturn]] void fail(const std::string& what) const;
  void expect(char c);
  void skip_value(int depth);
  void skip_number();
  void skip_literal(std::string_view word);
  uint32_t hex4();
  std::string_view text_;
  size_t pos_ = 0;
};

}  // namespace tessera
