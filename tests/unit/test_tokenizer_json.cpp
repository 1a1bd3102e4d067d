// The JSON reader used for JSONL corpora and encoder.json: strings with every escape,
// surrogate pairs, lone surrogates, skipped values, and syntax errors with their offsets.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "io/json_reader.hpp"

namespace tessera {
namespace {

std::string text_of(const std::string& json) {
  JsonReader r(json);
  std::string text = "<none>";
  r.read_object([&](const std::string& key) {
    if (key == "text")
      text = r.read_string();
    else
      r.skip_value();
  });
  r.expect_end();
  return text;
}

TEST(JsonReader, Strings) {
  EXPECT_EQ(text_of(R"({"text": "plain"})"), "plain");
  EXPECT_EQ(text_of(R"({"text": "q\" b\\ s\/ \b\f\n\r\t"})"), "q\" b\\ s/ \b\f\n\r\t");
  EXPECT_EQ(text_of(R"({"text": "caf\u00e9 \u4E2D"})"), "caf\xc3\xa9 \xe4\xb8\xad");
  EXPECT_EQ(text_of(R"({"text": "\ud83d\ude00"})"), "\xf0\x9f\x98\x80");  // surrogate pair
  EXPECT_EQ(text_of(R"({"text": "\ud83d x \ude00"})"),
            "\xef\xbf\xbd x \xef\xbf\xbd");  // lone surrogates -> U+FFFD
  EXPECT_EQ(text_of(R"({"text": "\ud83d\u0041"})"),
            "\xef\xbf\xbd"
            "A");
  EXPECT_EQ(text_of("{\"text\": \"raw \xe4\xb8\xad\"}"), "raw \xe4\xb8\xad");
  EXPECT_EQ(text_of(R"({"text": "\u0000"})"), std::string(1, '\0'));
}

TEST(JsonReader, SkipsOtherMembers) {
  EXPECT_EQ(text_of(R"( { "id": -12.5e+3, "m": {"a": [true, false, null, [], {}]},
                         "text": "t", "z": 0 } )"),
            "t");
  EXPECT_EQ(text_of(R"({"a": 1})"), "<none>");
  EXPECT_EQ(text_of(R"({})"), "<none>");
  EXPECT_EQ(text_of(R"({"text": "a", "text": "b"})"), "b");  // the last one, as JSON.parse
}

TEST(JsonReader, Integers) {
  JsonReader r(R"({"a": 0, "b": -7, "c": 9223372036854775807})");
  std::vector<int64_t> v;
  r.read_object([&](const std::string&) { v.push_back(r.read_integer()); });
  EXPECT_EQ(v, (std::vector<int64_t>{0, -7, 9223372036854775807}));
}

size_t error_offset(const std::string& json) {
  try {
    text_of(json);
  } catch (const JsonError& e) {
    return e.offset();
  }
  return std::string::npos;
}

TEST(JsonReader, SyntaxErrorsAndWhere) {
  EXPECT_EQ(error_offset(R"({"text" "x"})"), 8u);  // missing ':'
  EXPECT_EQ(error_offset(R"({"text": "x",})"), 13u);
  EXPECT_EQ(error_offset(R"({"text": "x"} extra)"), 14u);
  EXPECT_EQ(error_offset(R"(["text"])"), 0u);                 // not an object
  EXPECT_EQ(error_offset("{\"text\": \"tab\there\"}"), 13u);  // raw control character
  EXPECT_EQ(error_offset(R"({"text": "\x"})"), 11u);
  EXPECT_EQ(error_offset(R"({"text": "\u12G4"})"), 14u);
  EXPECT_EQ(error_offset(R"({"text": "open)"), 14u);
  EXPECT_EQ(error_offset(R"({"a": 01})"), 7u);  // after the number 0
  EXPECT_EQ(error_offset(R"({"a": 1.})"), 8u);
  EXPECT_EQ(error_offset(R"({"a": tru})"), 6u);
}

TEST(JsonReader, DeepNestingIsAnErrorNotACrash) {
  const std::string deep = "{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  try {
    text_of(deep);
    FAIL() << "no error";
  } catch (const JsonError& e) {
    EXPECT_NE(std::string(e.what()).find("nested deeper than 256"), std::string::npos);
  }
}

}  // namespace
}  // namespace tessera
