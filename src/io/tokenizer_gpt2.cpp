#include "io/tokenizer_gpt2.hpp"

#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/error.hpp"
#include "core/sha256.hpp"
#include "io/json_reader.hpp"
#include "io/tokenizer_pretokenize.hpp"
#include "io/tokenizer_unicode.hpp"

namespace tessera {
namespace {

constexpr uint32_t kNoMerge = std::numeric_limits<uint32_t>::max();
constexpr size_t kMaxCacheEntries = size_t(1) << 20;

std::string read_vocab_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TESSERA_REQUIRE(in.good(), "cannot open GPT-2 vocabulary file '", path,
                  "'; fetch encoder.json and vocab.bpe with tools/fetch-gpt2-vocab DIR");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string vocab_path(const std::string& dir, const char* name) {
  return (std::filesystem::path(dir) / name).string();
}

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the others for
// code points from U+0100 up, in byte order; returns each byte's code point.
std::array<char32_t, 256> byte_to_unicode() {
  std::array<char32_t, 256> cp{};
  char32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    cp[b] = printable ? b : next++;
  }
  return cp;
}

uint64_t pair_key(uint32_t left, uint32_t right) {
  return uint64_t(left) << 32 | right;
}

}  // namespace

Gpt2Tokenizer::Files Gpt2Tokenizer::read_files(const std::string& vocab_dir) {
  Files files;
  files.first = read_vocab_file(vocab_path(vocab_dir, "encoder.json"));
  files.second = read_vocab_file(vocab_path(vocab_dir, "vocab.bpe"));
  return files;
}

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& vocab_dir)
    : Gpt2Tokenizer(read_files(vocab_dir), vocab_dir) {}

Gpt2Tokenizer::Gpt2Tokenizer(std::string_view encoder_json, std::string_view vocab_bpe,
                             const std::string& origin) {
  load_encoder(encoder_json, origin);
  load_merges(vocab_bpe, origin);
  Sha256 sha;
  sha.update(encoder_json);
  sha.update(vocab_bpe);
  hash_ = sha.hex();
}

void Gpt2Tokenizer::load_encoder(std::string_view json, const std::string& origin) {
  const std::string where = origin + "/encoder.json";
  std::vector<std::pair<std::string, int64_t>> entries;
  try {
    JsonReader r(json);
    r.read_object([&](const std::string& key) { entries.emplace_back(key, r.read_integer()); });
    r.expect_end();
  } catch (const JsonError& e) {
    TESSERA_REQUIRE(false, "'", where, "' is not a JSON object of token ids: ", e.what(),
                    " at byte ", e.offset(), "; fetch it again with tools/fetch-gpt2-vocab");
  }
  const int64_t n = int64_t(entries.size());
  token_text_.assign(size_t(n), std::string());
  std::vector<bool> seen(size_t(n), false);
  for (auto& [text, id] : entries) {
    TESSERA_REQUIRE(id >= 0 && id < n && !seen[size_t(id)], "'", where, "': token id ", id, " of '",
                    text, "' is repeated or outside [0, ", n,
                    "); ids must number the tokens densely");
    seen[size_t(id)] = true;
    token_text_[size_t(id)] = text;
    id_of_.emplace(std::move(text), uint32_t(id));
  }
  // Each token's bytes, through the inverse of the byte-to-unicode map.
  const std::array<char32_t, 256> cp = byte_to_unicode();
  std::unordered_map<char32_t, uint8_t> byte_of;
  for (uint32_t b = 0; b < 256; ++b) byte_of[cp[b]] = uint8_t(b);
  token_bytes_.resize(size_t(n));
  for (size_t id = 0; id < size_t(n); ++id) {
    const std::string& text = token_text_[id];
    for (size_t pos = 0; pos < text.size();) {
      const Utf8Char c = utf8_next(text, pos);
      const auto it = byte_of.find(c.cp);
      TESSERA_REQUIRE(it != byte_of.end(), "'", where, "': token '", text, "' (id ", id,
                      ") holds a character that stands for no byte; is this a GPT-2 byte-level "
                      "vocabulary?");
      token_bytes_[id].push_back(char(it->second));
      pos += c.len;
    }
  }
  for (uint32_t b = 0; b < 256; ++b) {
    std::string one;
    utf8_append(one, cp[b]);
    const auto it = id_of_.find(one);
    TESSERA_REQUIRE(it != id_of_.end(), "'", where, "' lacks the token of byte ", b, " ('", one,
                    "'); a byte-level vocabulary has all 256");
    byte_token_[b] = it->second;
  }
  const auto eos = id_of_.find("<|endoftext|>");
  TESSERA_REQUIRE(eos != id_of_.end(), "'", where, "' lacks the end-of-text token <|endoftext|>");
  eos_ = eos->second;
}

// As the reference encoders read vocab.bpe: its lines split at '\n', without the first
// (#version) and the last (empty after the final newline); each line is "left right".
void Gpt2Tokenizer::load_merges(std::string_view bpe, const std::string& origin) {
  const std::string where = origin + "/vocab.bpe";
  std::vector<std::string_view> lines;
  for (size_t start = 0;;) {
    const size_t end = bpe.find('\n', start);
    lines.push_back(bpe.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  const auto id = [&](std::string_view s) {
    const auto it = id_of_.find(std::string(s));
    return it == id_of_.end() ? kNoMerge : it->second;
  };
  for (size_t i = 1; i + 1 < lines.size(); ++i) {
    const std::string_view line = lines[i];
    const size_t space = line.find(' ');
    const std::string_view left = line.substr(0, space);
    const std::string_view right =
        space == std::string_view::npos ? std::string_view() : line.substr(space + 1);
    TESSERA_REQUIRE(!left.empty() && !right.empty() && right.find(' ') == std::string_view::npos,
                    "'", where, "' line ", i + 1, " is '", line,
                    "', not a merge 'left right'; fetch it again with tools/fetch-gpt2-vocab");
    TESSERA_REQUIRE(id(left) != kNoMerge && id(right) != kNoMerge &&
                        id(std::string(left) + std::string(right)) != kNoMerge,
                    "'", where, "' line ", i + 1, ": merge '", line,
                    "' names a token missing from encoder.json; the two files do not belong "
                    "together");
    // The reference looks ranks up by "left,right": every split of that string at a comma
    // into two tokens whose concatenation is a token gets this merge's rank.
    const uint32_t rank = uint32_t(i - 1);
    const std::string key = std::string(left) + "," + std::string(right);
    for (size_t comma = key.find(','); comma != std::string::npos;
         comma = key.find(',', comma + 1)) {
      const std::string a = key.substr(0, comma), b = key.substr(comma + 1);
      const uint32_t ia = id(a), ib = id(b), merged = id(a + b);
      if (ia != kNoMerge && ib != kNoMerge && merged != kNoMerge)
        merges_[pair_key(ia, ib)] = Merge{rank, merged};
    }
  }
}

// Merges the piece's byte tokens pair by pair, lowest rank first, until no pair has a rank.
// Ties (only possible through the comma quirk) go to the rightmost pair, as in the reference.
void Gpt2Tokenizer::bpe(std::string_view piece, std::vector<uint32_t>& word) const {
  word.clear();
  for (const char c : piece) word.push_back(byte_token_[uint8_t(c)]);
  while (word.size() > 1) {
    uint32_t best = kNoMerge;
    size_t at = 0;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      const auto it = merges_.find(pair_key(word[i], word[i + 1]));
      if (it != merges_.end() && it->second.rank <= best) best = it->second.rank, at = i;
    }
    if (best == kNoMerge) break;
    const uint32_t left = word[at], right = word[at + 1];
    const uint32_t merged = merges_.at(pair_key(left, right)).result;
    size_t out = 0;
    for (size_t i = 0; i < word.size(); ++out) {
      if (i + 1 < word.size() && word[i] == left && word[i + 1] == right) {
        word[out] = merged;
        i += 2;
      } else {
        word[out] = word[i++];
      }
    }
    word.resize(out);
  }
}

std::vector<uint32_t> Gpt2Tokenizer::encode(std::string_view text) {
  std::vector<uint32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  std::vector<uint32_t> word;
  for (const std::string_view piece : gpt2_pretokenize(text)) {
    if (piece.size() == 1) {
      ids.push_back(byte_token_[uint8_t(piece[0])]);
      continue;
    }
    auto it = cache_.find(piece);
    if (it == cache_.end()) {
      if (cache_.size() >= kMaxCacheEntries) cache_.clear();
      bpe(piece, word);
      it = cache_.emplace(std::string(piece), word).first;
    }
    ids.insert(ids.end(), it->second.begin(), it->second.end());
  }
  return ids;
}

std::string Gpt2Tokenizer::decode(std::span<const uint32_t> ids) const {
  std::string text;
  for (const uint32_t id : ids) {
    TESSERA_REQUIRE(id < token_bytes_.size(), "gpt2 tokenizer: token id ", id,
                    " is outside the vocabulary [0, ", token_bytes_.size(),
                    "); the ids come from another tokenizer");
    text += token_bytes_[id];
  }
  return text;
}

}  // namespace tessera
