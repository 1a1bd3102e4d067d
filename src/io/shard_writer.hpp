// Writes a sharded dataset (io/shard_index.hpp): documents go to shards NAME-00000.h5,
// NAME-00001.h5, ... next to the index NAME.h5, a shard closing after the document that brings
// it to shard_tokens tokens or more (a document is never split), so the shards' tokens in order
// are those one file would hold. Each shard is a complete "tessera-dataset" file written as
// DatasetWriter writes one; the index is written last (as NAME.h5.tmp, renamed), with each
// shard's tokens, documents and size. Nothing depends on time or threads: the same inputs give
// the same bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/dataset_writer.hpp"
#include "io/shard_index.hpp"

namespace tessera {

class ShardedDatasetWriter {
 public:
  ShardedDatasetWriter(const std::string& index_path, const Tokenizer& tokenizer, bool split_lines,
                       int64_t shard_tokens, bool loss_mask = false);
  ~ShardedDatasetWriter();  // unfinished: the shards it finished are removed
  ShardedDatasetWriter(const ShardedDatasetWriter&) = delete;
  ShardedDatasetWriter& operator=(const ShardedDatasetWriter&) = delete;

  void begin_input(const std::string& input_path, uint64_t bytes);
  void add_document(std::span<const uint32_t> ids, int64_t masked = 0);  // as DatasetWriter's
  void finish();  // the last shard, then the index

  int64_t documents() const { return int64_t(layout_.doc_offsets.size()) - 1; }
  int64_t tokens() const { return int64_t(layout_.doc_offsets.back()); }
  int64_t shards() const { return int64_t(layout_.files.size()) + (shard_ ? 1 : 0); }

 private:
  struct Input {
    std::string path;
    uint64_t bytes;
    int64_t documents = 0, tokens = 0;
  };
  void close_shard();

  std::string path_;
  const Tokenizer& tokenizer_;
  bool split_lines_, loss_mask_;
  int64_t shard_tokens_;
  std::unique_ptr<DatasetWriter> shard_;  // the shard being written
  ShardLayout layout_;                    // of the shards finished
  std::vector<Input> inputs_;
  bool finished_ = false;
};

}  // namespace tessera
