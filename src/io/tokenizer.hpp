// Text <-> token ids. Two kinds: "byte" (ids 0..255 are the bytes, EOS 256) and "gpt2"
// (GPT-2's byte-level BPE read from encoder.json + vocab.bpe, EOS 50256 = <|endoftext|>).
// encode never emits EOS; a dataset writer appends it after each document.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Not thread-safe: a tokenizer may cache results.
  virtual std::vector<uint32_t> encode(std::string_view text) = 0;
  // The bytes the ids stand for; EOS is written as "<|endoftext|>". Throws on an id outside
  // the vocabulary.
  virtual std::string decode(std::span<const uint32_t> ids) const = 0;
  virtual uint32_t vocab_size() const = 0;
  virtual uint32_t eos_id() const = 0;
  virtual std::string kind() const = 0;  // "byte" or "gpt2"
  // Hex SHA-256 over the vocabulary files' bytes (encoder.json then vocab.bpe); "" for byte.
  virtual std::string vocab_hash() const = 0;
};

// kind "byte" or "gpt2"; vocab_dir holds encoder.json and vocab.bpe (gpt2 only).
// Throws a collective Error naming what is wrong (unknown kind, missing files + the fix).
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& vocab_dir);

}  // namespace tessera
