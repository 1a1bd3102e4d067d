// The input deck (core/deck.hpp) and its schema (core/schema.hpp): defaults, deck text and
// command-line overrides, the error messages of every kind of fault, and the resolved deck
// written back as INI and JSON.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/deck.hpp"
#include "core/error.hpp"
#include "core/schema.hpp"

namespace tessera {
namespace {

const std::string kMinimal = "[data]\npath = corpus.txt\n";

// The message of the tessera::Error that resolving the deck raises; fails unless it is
// collective (every rank parses the same deck and raises the same error).
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    Deck::from_text(text, overrides);
  } catch (const Error& e) {
    EXPECT_TRUE(e.collective()) << e.what();
    return e.what();
  }
  std::string args;
  for (const std::string& o : overrides) args += " " + o;
  ADD_FAILURE() << "no error for deck:\n" << text << "with overrides:" << args;
  return {};
}

// Every key of a deck, as its typed getter reads it (reals compared by value).
void expect_same_values(const Deck& a, const Deck& b) {
  for (const KeySpec& k : deck_schema()) {
    const std::string n = k.name();
    switch (k.type) {
      case KeyType::integer:
        EXPECT_EQ(a.integer(n), b.integer(n)) << n;
        break;
      case KeyType::real:
        EXPECT_EQ(a.real(n), b.real(n)) << n;
        break;
      case KeyType::boolean:
        EXPECT_EQ(a.boolean(n), b.boolean(n)) << n;
        break;
      default:
        EXPECT_EQ(a.str(n), b.str(n)) << n;
    }
  }
}

// ---- a minimal strict JSON reader, enough to check Deck::to_json -------------------------

class Json {
 public:
  // Flattens {"section": {"key": value}} into "section.key" -> value text (strings unescaped,
  // numbers and literals as written). Throws std::runtime_error on any syntax error.
  static std::map<std::string, std::string> flatten(const std::string& text) {
    Json j(text);
    std::map<std::string, std::string> out;
    j.object([&](const std::string& section) {
      j.object([&](const std::string& key) { out[section + "." + key] = j.scalar(); });
    });
    j.skip_ws();
    if (j.i_ != text.size()) j.fail("trailing text");
    return out;
  }

 private:
  explicit Json(const std::string& s) : s_(s) {}

  [[noreturn]] void fail(const std::string& why) const {
    throw std::runtime_error("JSON: " + why + " at offset " + std::to_string(i_));
  }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r'))
      ++i_;
  }
  void expect(char c) {
    skip_ws();
    if (i_ >= s_.size() || s_[i_] != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  template <class Member>
  void object(Member member) {
    expect('{');
    skip_ws();
    if (i_ < s_.size() && s_[i_] == '}') {
      ++i_;
      return;
    }
    for (;;) {
      const std::string key = string();
      expect(':');
      member(key);
      skip_ws();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      expect('}');
      return;
    }
  }
  std::string string() {
    expect('"');
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      const unsigned char c = static_cast<unsigned char>(s_[i_++]);
      if (c < 0x20) fail("unescaped control character in a string");
      if (c != '\\') {
        out += char(c);
        continue;
      }
      if (i_ >= s_.size()) fail("unterminated escape");
      const char e = s_[i_++];
      const std::string simple = "\"\\/bfnrt", value = "\"\\/\b\f\n\r\t";
      const size_t at = simple.find(e);
      if (at == std::string::npos) fail("bad escape");  // \u is not needed here
      out += value[at];
    }
    expect('"');
    return out;
  }
  std::string scalar() {
    skip_ws();
    if (i_ < s_.size() && s_[i_] == '"') return string();
    for (const char* lit : {"true", "false", "null"})
      if (s_.compare(i_, std::string(lit).size(), lit) == 0) {
        i_ += std::string(lit).size();
        return lit;
      }
    // number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
    const size_t b = i_;
    auto digits = [&] {
      const size_t d = i_;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
      if (i_ == d) fail("expected a digit");
    };
    if (s_[i_] == '-') ++i_;
    if (i_ < s_.size() && s_[i_] == '0')
      ++i_;
    else
      digits();
    if (i_ < s_.size() && s_[i_] == '.') ++i_, digits();
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      digits();
    }
    return s_.substr(b, i_ - b);
  }

  const std::string& s_;
  size_t i_ = 0;
};

TEST(JsonReader, AcceptsJsonAndRejectsNonJson) {
  const auto m = Json::flatten(R"({"a": {"x": 1, "y": "q\"\\", "z": true}, "b": {"w": -2.5e+3}})");
  EXPECT_EQ(m.at("a.x"), "1");
  EXPECT_EQ(m.at("a.y"), "q\"\\");
  EXPECT_EQ(m.at("a.z"), "true");
  EXPECT_EQ(m.at("b.w"), "-2.5e+3");
  for (const char* bad : {R"({"a": {"x": 01}})", R"({"a": {"x": .5}})", R"({"a": {"x": inf}})",
                          R"({"a": {"x": 1,}})", "{\"a\": {\"x\": \"tab\there\"}}",
                          R"({"a": {"x": 1}})"
                          "}"})
    EXPECT_THROW(Json::flatten(bad), std::runtime_error) << bad;
}

// ---- resolution ----------------------------------------------------------------------------

TEST(Deck, DefaultsResolve) {
  const Deck d = Deck::from_text(kMinimal, {});
  EXPECT_EQ(d.str("data.path"), "corpus.txt");
  EXPECT_EQ(d.str("model.arch"), "llama");
  EXPECT_EQ(d.integer("model.layers"), 4);
  EXPECT_EQ(d.integer("model.d_model"), 128);
  EXPECT_EQ(d.integer("model.kv_heads"), 0);
  EXPECT_DOUBLE_EQ(d.real("optim.lr"), 3e-4);
  EXPECT_DOUBLE_EQ(d.real("model.norm_eps"), 1e-5);
  EXPECT_FALSE(d.boolean("optim.decay_embeddings"));
  EXPECT_TRUE(d.boolean("output.echo_deck"));
  EXPECT_EQ(d.str("output.dir"), "run");
  EXPECT_EQ(d.origin(), "<text>");
  // Every schema key resolves through its typed getter, and each default lies in its domain.
  for (const KeySpec& k : deck_schema()) {
    const std::string n = k.name();
    switch (k.type) {
      case KeyType::integer: {
        const int64_t v = d.integer(n);
        EXPECT_TRUE(double(v) >= k.min && double(v) <= k.max) << n << " = " << v;
        break;
      }
      case KeyType::real: {
        const double v = d.real(n);
        EXPECT_TRUE(v >= k.min && v <= k.max) << n << " = " << v;
        break;
      }
      case KeyType::boolean:
        d.boolean(n);
        break;
      case KeyType::choice:
        EXPECT_NE(std::find(k.choices.begin(), k.choices.end(), d.str(n)), k.choices.end()) << n;
        break;
      default:
        d.str(n);
    }
  }
  // A getter of the wrong type, or of a key not in the schema, is a programming error.
  EXPECT_THROW(d.real("model.layers"), std::logic_error);
  EXPECT_THROW(d.integer("model.no_such_key"), std::logic_error);
}

TEST(Deck, SchemaNamesAreUnique) {
  std::map<std::string, int> seen;
  for (const KeySpec& k : deck_schema()) EXPECT_EQ(seen[k.name()]++, 0) << k.name();
  ASSERT_NE(find_key("data.path"), nullptr);
  EXPECT_TRUE(find_key("data.path")->required);
  EXPECT_EQ(find_key("model.nope"), nullptr);
}

TEST(Deck, TextThenCommandLineWhichWins) {
  const std::string text =
      "# a comment\n"
      "[model]\n"
      "layers = 6   # trailing comment\n"
      "  d_model=64\n"
      "arch = gpt2\n"
      "[train]\n"
      "steps = 50\n" +
      kMinimal;
  const Deck d = Deck::from_text(
      text, {"--model.layers=8", "--optim.lr=0.001", "--data.path=other.txt"}, "test.in");
  EXPECT_EQ(d.integer("model.layers"), 8);      // text 6, command line 8
  EXPECT_EQ(d.integer("model.d_model"), 64);    // text only
  EXPECT_EQ(d.str("model.arch"), "gpt2");       // text only
  EXPECT_EQ(d.integer("train.steps"), 50);      // text only
  EXPECT_DOUBLE_EQ(d.real("optim.lr"), 0.001);  // command line only
  EXPECT_EQ(d.str("data.path"), "other.txt");   // both
  EXPECT_EQ(d.integer("model.heads"), 4);       // neither
  EXPECT_EQ(d.origin(), "test.in");
  // A key given twice: the later one counts.
  EXPECT_EQ(
      Deck::from_text(kMinimal, {"--model.layers=3", "--model.layers=5"}).integer("model.layers"),
      5);
  // In a deck file a key twice is an error: which one was meant?
  EXPECT_NE(error_of(kMinimal + "[model]\nlayers = 3\nlayers = 7\n")
                .find("sets model.layers twice ('3' and '7'); keep one"),
            std::string::npos);
  // The command line alone can supply the required key.
  EXPECT_EQ(Deck::from_text("", {"--data.path=x"}).str("data.path"), "x");
}

// ---- errors --------------------------------------------------------------------------------

TEST(DeckErrors, UnknownKeySuggestsTheClosest) {
  std::string msg = error_of(kMinimal + "[model]\nlayer = 3\n");
  EXPECT_NE(msg.find("model.layer'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'model.layers'"), std::string::npos) << msg;
  msg = error_of(kMinimal + "[optim]\nwarmpu = 3\n");
  EXPECT_NE(msg.find("did you mean 'optim.warmup'"), std::string::npos) << msg;
  msg = error_of(kMinimal, {"--optim.weight_decya=0.1"});
  EXPECT_NE(msg.find("optim.weight_decya"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'optim.weight_decay'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("command line"), std::string::npos) << msg;
}

// The schema's doc says unknown keys are errors; boost's command-line parser by default
// accepts any unambiguous prefix of a key (allow_guessing), so a misspelt override that is a
// prefix of a real key silently sets that key. Disabled until deck.cpp turns guessing off.
TEST(DeckErrors, CommandLinePrefixOfAKeyIsUnknown) {
  for (const char* o : {"--model.layer=3", "--train.step=3", "--optim.l=0.1"}) {
    const std::string msg = error_of(kMinimal, {o});
    EXPECT_NE(msg.find("unknown deck key"), std::string::npos) << o << ": " << msg;
  }
}

TEST(DeckErrors, WrongTypeAndRangeShowValueAndDomain) {
  struct Case {
    std::string override, seen, allowed;
  };
  const std::vector<Case> cases = {
      {"--model.layers=four", "'four'", "integer in [1, 4096]"},
      {"--model.layers=2.5", "'2.5'", "integer in [1, 4096]"},
      {"--model.layers=0", "'0'", "integer in [1, 4096]"},
      {"--model.layers=4097", "'4097'", "integer in [1, 4096]"},
      {"--optim.beta1=1.5", "'1.5'", "number in [0, 0.999999]"},
      {"--optim.lr=fast", "'fast'", "number in [0, 10]"},
      {"--optim.lr=-1e-3", "'-1e-3'", "number in [0, 10]"},
      {"--optim.grad_clip=nan", "'nan'", "finite number >= 0"},
      {"--model.arch=gpt3", "'gpt3'", "one of llama, gpt2"},
      {"--output.echo_deck=maybe", "'maybe'", "true or false"},
  };
  for (const Case& c : cases) {
    const std::string msg = error_of(kMinimal, {c.override});
    const std::string key = c.override.substr(2, c.override.find('=') - 2);
    EXPECT_NE(msg.find(key), std::string::npos) << c.override << ": " << msg;
    EXPECT_NE(msg.find(c.seen), std::string::npos) << c.override << ": " << msg;
    EXPECT_NE(msg.find(c.allowed), std::string::npos) << c.override << ": " << msg;
  }
  // The same checks apply to the deck text, which the message names as the origin.
  const std::string msg = error_of(kMinimal + "[model]\nheads = -2\n");
  EXPECT_NE(msg.find("model.heads = '-2' (<text>)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("out of range"), std::string::npos) << msg;
}

TEST(DeckErrors, BoundsAreInclusive) {
  const Deck d = Deck::from_text(
      kMinimal, {"--model.layers=4096", "--optim.beta1=0", "--model.norm_eps=1", "--train.seed=0"});
  EXPECT_EQ(d.integer("model.layers"), 4096);
  EXPECT_EQ(d.real("optim.beta1"), 0.0);
  EXPECT_EQ(d.real("model.norm_eps"), 1.0);
}

TEST(Deck, BooleanSpellings) {
  for (const char* v : {"true", "1", "yes", "on"})
    EXPECT_TRUE(Deck::from_text(kMinimal, {std::string("--optim.decay_embeddings=") + v})
                    .boolean("optim.decay_embeddings"))
        << v;
  for (const char* v : {"false", "0", "no", "off"})
    EXPECT_FALSE(Deck::from_text(kMinimal + "[output]\necho_deck = " + v + "\n", {})
                     .boolean("output.echo_deck"))
        << v;
  EXPECT_NE(error_of(kMinimal, {"--output.echo_deck=2"}).find("true or false"), std::string::npos);
}

TEST(DeckErrors, MissingRequiredKey) {
  for (const std::string& text : {std::string(), std::string("[model]\nlayers = 2\n")}) {
    const std::string msg = error_of(text);
    EXPECT_NE(msg.find("required deck key data.path is missing"), std::string::npos) << msg;
  }
}

TEST(DeckErrors, MalformedInput) {
  EXPECT_NE(error_of(kMinimal, {"--model.layers"}).find("--section.key=value"), std::string::npos);
  EXPECT_NE(error_of(kMinimal + "[model\nlayers = 2\n").find("cannot parse input deck"),
            std::string::npos);
}

TEST(DeckErrors, FromArgs) {
  std::string msg;
  try {
    Deck::from_args({"tessera", "/nonexistent/deck.in"});
  } catch (const Error& e) {
    EXPECT_TRUE(e.collective());
    msg = e.what();
  }
  EXPECT_NE(msg.find("cannot open input deck '/nonexistent/deck.in'"), std::string::npos) << msg;
  EXPECT_THROW(Deck::from_args({"tessera"}), Error);
  EXPECT_THROW(Deck::from_args({"tessera", "a.in", "b.in"}), Error);
}

// ---- the resolved deck written back ---------------------------------------------------------

const std::string kFull =
    "[model]\narch = gpt2\nlayers = 3\nnorm_eps = 2.5e-6\n[optim]\nlr = 0.001\n"
    "decay_embeddings = yes\n" +
    kMinimal;

TEST(DeckOutput, JsonParsesAndHoldsTheValues) {
  const Deck d = Deck::from_text(kFull, {"--train.steps=7", "--data.path=dir/a \"b\" \\c.txt"});
  const std::string json = d.to_json();
  std::map<std::string, std::string> m;
  ASSERT_NO_THROW(m = Json::flatten(json)) << json;
  EXPECT_EQ(m.size(), deck_schema().size());
  EXPECT_EQ(m.at("model.arch"), "gpt2");
  EXPECT_EQ(m.at("model.layers"), "3");
  EXPECT_EQ(std::stod(m.at("model.norm_eps")), 2.5e-6);
  EXPECT_EQ(std::stod(m.at("optim.lr")), 0.001);
  EXPECT_EQ(m.at("optim.decay_embeddings"), "true");
  EXPECT_EQ(m.at("output.echo_deck"), "true");
  EXPECT_EQ(m.at("train.steps"), "7");
  EXPECT_EQ(m.at("data.path"), "dir/a \"b\" \\c.txt");
  // Defaults are written too, and every value is the one the getters return.
  for (const KeySpec& k : deck_schema()) {
    const std::string& v = m.at(k.name());
    if (k.type == KeyType::integer)
      EXPECT_EQ(std::stoll(v), d.integer(k.name())) << k.name();
    else if (k.type == KeyType::real)
      EXPECT_EQ(std::stod(v), d.real(k.name())) << k.name();
    else if (k.type == KeyType::boolean)
      EXPECT_EQ(v, d.boolean(k.name()) ? "true" : "false") << k.name();
    else
      EXPECT_EQ(v, d.str(k.name())) << k.name();
  }
}

TEST(DeckOutput, IniRoundTripsToTheSameValues) {
  const Deck d = Deck::from_text(kFull, {"--optim.warmup=3"});
  const Deck back = Deck::from_text(d.to_ini(), {});
  expect_same_values(d, back);
  // Once every value has been through the parser, to_ini is a fixed point.
  const Deck again = Deck::from_text(back.to_ini(), {});
  EXPECT_EQ(again.to_ini(), back.to_ini());
  EXPECT_EQ(again.to_json(), back.to_json());
}

// to_ini of a freshly resolved deck should read back as an identical deck. It does not yet:
// defaults are stored as the schema spells them ("1e-5", "10000", "1.0") while parsed values
// are canonicalised ("1e-05", "1e+04", "1"), so the text (and run.json) of the same setting
// depends on whether it came from the default or the deck. Disabled until deck.cpp
// canonicalises defaults.
TEST(DeckOutput, IniRoundTripIsIdentical) {
  const Deck d = Deck::from_text(kFull, {});
  const Deck back = Deck::from_text(d.to_ini(), {});
  EXPECT_EQ(back.to_ini(), d.to_ini());
  EXPECT_EQ(back.to_json(), d.to_json());
}

// ---- suggestions ---------------------------------------------------------------------------

TEST(Deck, EditDistance) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("abc", ""), 3u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("layers", "layers"), 0u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("flaw", "lawn"), 2u);
  EXPECT_EQ(edit_distance("warmpu", "warmup"), 2u);  // a transposition is two edits
  EXPECT_EQ(edit_distance("lr", "min_lr"), 4u);
  EXPECT_EQ(edit_distance("sitting", "kitten"), edit_distance("kitten", "sitting"));
}

TEST(Deck, ClosestKey) {
  EXPECT_EQ(closest_key("model.layer"), "model.layers");
  EXPECT_EQ(closest_key("model.dmodel"), "model.d_model");
  EXPECT_EQ(closest_key("optim.bta1"), "optim.beta1");
  // Without a section the bare key is compared.
  EXPECT_EQ(closest_key("layer"), "model.layers");
  EXPECT_EQ(closest_key("sed"), "train.seed");
}

}  // namespace
}  // namespace tessera
