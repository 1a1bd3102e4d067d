// Writes a token dataset in the "tessera-dataset" format, version 1, or 2 with a loss mask
// (HDF5):
//   /tokens        1-D, uint16 when vocab_size <= 65536 else uint32: every document's tokens,
//                  each document followed by EOS
//   /doc_offsets   1-D uint64 [n_docs + 1]: token offset where document i starts; the last
//                  entry is n_tokens (document i is tokens[off[i], off[i+1]), EOS included)
//   root attributes: format = "tessera-dataset", version = 1, tokenizer ("byte" | "gpt2"),
//                  vocab_size, eos_id, vocab_hash (hex SHA-256 of the vocabulary files, "" for
//                  byte), n_docs, n_tokens (int64 unless noted) and manifest, a JSON string:
//                  {"inputs": [{"path", "bytes", "documents", "tokens"}, ...], "split_lines"}
//   /loss_mask     version 2 only: 1-D uint8 [n_tokens], 1 where the token counts as a target
//                  of the loss (a response's tokens and its EOS), 0 where it does not (the
//                  prompt's); chunked as /tokens. A version 1 file trains on every token.
// /tokens is chunked (2^20 elements: 2 or 4 MiB, more than HDF5's default 1 MiB chunk cache,
// so a reader's small hyperslab reads go straight to the file) and written as it grows; the
// file is written as OUT.tmp and renamed to OUT when complete. A shard of a sharded dataset
// (io/shard_writer.hpp) may take smaller chunks, so that a small shard is a small file.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace tessera {

class H5File;
class Tokenizer;

class DatasetWriter {
 public:
  static constexpr int64_t kChunkTokens = int64_t(1) << 20;
  // loss_mask: write /loss_mask (version 2); documents then say how many of their first
  // tokens are masked.
  DatasetWriter(const std::string& path, const Tokenizer& tokenizer, bool split_lines,
                int64_t chunk_tokens = kChunkTokens, bool loss_mask = false);
  // The name the dataset is written under until finish() renames it to path.
  static std::string temporary_path(const std::string& path) { return path + ".tmp"; }
  ~DatasetWriter();  // an unfinished file is removed
  DatasetWriter(const DatasetWriter&) = delete;
  DatasetWriter& operator=(const DatasetWriter&) = delete;

  // Documents added after begin_input(path, bytes) count toward that input in the manifest.
  void begin_input(const std::string& input_path, uint64_t bytes);
  // Appends a document's tokens and EOS; with a loss mask its first `masked` tokens get mask 0
  // and the rest, EOS included, mask 1 (masked <= ids.size()).
  void add_document(std::span<const uint32_t> ids, int64_t masked = 0);
  // Writes offsets and attributes, closes and renames to the final path.
  void finish();

  int64_t documents() const { return int64_t(offsets_.size()) - 1; }
  int64_t tokens() const { return offsets_.back(); }
  bool wide() const { return wide_; }  // tokens stored as uint32
  bool loss_mask() const { return loss_mask_; }

 private:
  struct Input {
    std::string path;
    uint64_t bytes;
    int64_t documents = 0, tokens = 0;
  };
  void flush();
  std::string manifest() const;

  std::string path_, tmp_path_;
  std::string kind_, vocab_hash_;
  int64_t vocab_size_, eos_;
  bool split_lines_, wide_, loss_mask_;
  int64_t chunk_;  // elements of a chunk of /tokens
  std::unique_ptr<H5File> file_;
  std::vector<uint32_t> pending_;  // tokens not yet appended to /tokens
  std::vector<uint16_t> narrow_;   // pending_ as uint16, when !wide_
  std::vector<uint8_t> mask_;      // the loss mask of pending_, when loss_mask_
  std::vector<uint64_t> offsets_{0};
  std::vector<Input> inputs_;
  bool finished_ = false;
};

// s as a JSON string literal, quotes included.
std::string json_quote(std::string_view s);

}  // namespace tessera
