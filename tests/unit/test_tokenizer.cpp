// The byte tokenizer, SHA-256 (FIPS 180-2 test vectors) and the GPT-2 pre-tokeniser on
// hand-checked splits (each also checked against the JavaScript RegExp it implements).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/sha256.hpp"
#include "io/tokenizer.hpp"
#include "io/tokenizer_pretokenize.hpp"
#include "io/tokenizer_unicode.hpp"

namespace tessera {
namespace {

TEST(ByteTokenizer, RoundTripsEveryByte) {
  const auto tok = make_tokenizer("byte", "");
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(char(b));
  all += "caf\xc3\xa9 \xff\xfe";
  const std::vector<uint32_t> ids = tok->encode(all);
  ASSERT_EQ(ids.size(), all.size());
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(ids[i], uint8_t(all[i]));
  EXPECT_EQ(tok->decode(ids), all);
  EXPECT_EQ(tok->vocab_size(), 257u);
  EXPECT_EQ(tok->eos_id(), 256u);
  EXPECT_EQ(tok->kind(), "byte");
  EXPECT_EQ(tok->vocab_hash(), "");
  EXPECT_EQ(tok->decode(std::vector<uint32_t>{104, 105, 256}), "hi<|endoftext|>");
  EXPECT_THROW(tok->decode(std::vector<uint32_t>{257}), Error);
}

TEST(Tokenizer, UnknownKindNamesTheChoices) {
  try {
    make_tokenizer("bpe", "");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown tokenizer 'bpe'; allowed: byte, gpt2"),
              std::string::npos)
        << e.what();
  }
}

TEST(Sha256, StandardVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, IncrementalEqualsOneShot) {
  std::string text;
  for (int i = 0; i < 1000; ++i) text += char('a' + i % 26);
  for (size_t cut : {0, 1, 55, 56, 63, 64, 65, 127, 500, 1000}) {
    Sha256 s;
    s.update(std::string_view(text).substr(0, cut));
    s.update(std::string_view(text).substr(cut));
    EXPECT_EQ(s.hex(), sha256_hex(text)) << "cut at " << cut;
  }
}

std::vector<std::string> split(std::string_view text) {
  std::vector<std::string> out;
  for (const std::string_view p : gpt2_pretokenize(text)) out.emplace_back(p);
  return out;
}
using S = std::vector<std::string>;

TEST(Gpt2Pretokenize, Contractions) {
  EXPECT_EQ(split("I'm don't"), (S{"I", "'m", " don", "'t"}));
  EXPECT_EQ(split("we'll they've you're he'd"),
            (S{"we", "'ll", " they", "'ve", " you", "'re", " he", "'d"}));
  EXPECT_EQ(split("'S"), (S{"'", "S"}));  // upper case is no contraction
  EXPECT_EQ(split("''"), (S{"''"}));
  EXPECT_EQ(split("'''s"), (S{"'''", "s"}));
  EXPECT_EQ(split("THEY'LL 'll've"), (S{"THEY", "'", "LL", " '", "ll", "'ve"}));
}

TEST(Gpt2Pretokenize, Spaces) {
  EXPECT_EQ(split("Hello world"), (S{"Hello", " world"}));
  EXPECT_EQ(split("hello   world"), (S{"hello", "  ", " world"}));
  EXPECT_EQ(split("a\n\nb"), (S{"a", "\n", "\n", "b"}));
  EXPECT_EQ(split("a \n b"), (S{"a", " \n", " b"}));
  EXPECT_EQ(split("end   "), (S{"end", "   "}));
  EXPECT_EQ(split("\t\tword"), (S{"\t", "\t", "word"}));
  EXPECT_EQ(split("x  ,y"), (S{"x", " ", " ,", "y"}));
  EXPECT_EQ(split(" "), (S{" "}));
  EXPECT_EQ(split("\xc2\xa0x"), (S{"\xc2\xa0", "x"}));  // no-break space is \s, not ' '
  EXPECT_EQ(split("a\xe3\x80\x80\xe3\x80\x80"
                  "b"),
            (S{"a", "\xe3\x80\x80", "\xe3\x80\x80", "b"}));
  EXPECT_EQ(split("\xef\xbb\xbfz"), (S{"\xef\xbb\xbf", "z"}));  // U+FEFF is \s in JavaScript
  EXPECT_TRUE(split("").empty());
}

TEST(Gpt2Pretokenize, DigitsAndPunctuation) {
  EXPECT_EQ(split("abc123def"), (S{"abc", "123", "def"}));
  EXPECT_EQ(split(" 42"), (S{" 42"}));
  EXPECT_EQ(split("3.14"), (S{"3", ".", "14"}));
  EXPECT_EQ(split("Hi!!! ?"), (S{"Hi", "!!!", " ?"}));
  EXPECT_EQ(split("x\xc2\xb2"), (S{"x", "\xc2\xb2"}));  // superscript two: \p{N}
  EXPECT_EQ(split("\xe2\x85\xab \xe2\x85\xbb"), (S{"\xe2\x85\xab", " \xe2\x85\xbb"}));  // Roman XII
}

TEST(Gpt2Pretokenize, UnicodeLetters) {
  EXPECT_EQ(split("caf\xc3\xa9 na\xc3\xafve"), (S{"caf\xc3\xa9", " na\xc3\xafve"}));
  EXPECT_EQ(split("\xe4\xb8\xad\xe6\x96\x87\xe5\xad\x97"),
            (S{"\xe4\xb8\xad\xe6\x96\x87\xe5\xad\x97"}));
  EXPECT_EQ(split("e\xcc\x81"), (S{"e", "\xcc\x81"}));  // a combining mark is not \p{L}
  EXPECT_EQ(split("hi\xf0\x9f\x98\x80\xf0\x9f\x98\x80 x"),
            (S{"hi", "\xf0\x9f\x98\x80\xf0\x9f\x98\x80", " x"}));
  EXPECT_EQ(split("\xf0\x9d\x90\x80\xf0\x9d\x90\x81!"),
            (S{"\xf0\x9d\x90\x80\xf0\x9d\x90\x81", "!"}));
}

TEST(Gpt2Pretokenize, MalformedUtf8IsPunctuationAndCovered) {
  EXPECT_EQ(split("\xff\xfe"
                  "ab"),
            (S{"\xff\xfe", "ab"}));
  EXPECT_EQ(split("a\xe4\xb8"), (S{"a", "\xe4\xb8"}));  // truncated sequence
  std::string joined;
  const std::string text = "x \xed\xa0\x80 \xc0\xaf y\xf4\x90\x80\x80";
  for (const std::string& p : split(text)) joined += p;
  EXPECT_EQ(joined, text);
}

TEST(UnicodeClasses, AgreeWithJavaScriptOnSamples) {
  EXPECT_EQ(char_class('a'), CharClass::letter);
  EXPECT_EQ(char_class('7'), CharClass::number);
  EXPECT_EQ(char_class('\v'), CharClass::space);
  EXPECT_EQ(char_class('_'), CharClass::other);
  EXPECT_EQ(char_class(0x4E2D), CharClass::letter);   // CJK
  EXPECT_EQ(char_class(0x0301), CharClass::other);    // combining acute
  EXPECT_EQ(char_class(0x0085), CharClass::other);    // NEL is not \s in JavaScript
  EXPECT_EQ(char_class(0x2028), CharClass::space);    // line separator is
  EXPECT_EQ(char_class(0x00BD), CharClass::number);   // one half
  EXPECT_EQ(char_class(0x1F600), CharClass::other);   // emoji
  EXPECT_EQ(char_class(0x20000), CharClass::letter);  // CJK extension B
  EXPECT_EQ(char_class(0x10FFFF), CharClass::other);
}

}  // namespace
}  // namespace tessera
