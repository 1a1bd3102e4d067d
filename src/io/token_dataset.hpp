// Reads a "tessera-dataset" HDF5 file (written by tessera-prep; format in
// io/dataset_writer.hpp), or a sharded dataset (io/shard_index.hpp: an index, or a list of
// files, whose tokens concatenated are the dataset), for training: documents are split
// deterministically into train and validation by a hash of their index; each split is a stream
// of its documents' tokens; sample k of a split is the window of seq_len + 1 tokens at stream
// offset k * seq_len. Every rank reads only the hyperslabs of the samples it trains on (parallel
// HDF5 for one file; the shards of a sharded dataset are opened by each rank at its first read
// of them, io/shard_set.hpp). A sharded dataset trains exactly as one file holding its tokens.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/dataset_file.hpp"
#include "io/shard_set.hpp"

namespace tessera {

class TokenDataset {
 public:
  enum Split { train, validation };

  // Opens the file collectively on comm, or lays a sharded dataset out (rank 0 reads its index
  // or its files' headers); collective Errors name the file and the mismatch. max_open: the
  // shards of a sharded dataset open at once on each rank.
  TokenDataset(const std::string& path, MPI_Comm comm, const DatasetExpectation& expect,
               double val_fraction, int max_open = ShardSet::kDefaultMaxOpen);
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;

  int64_t samples(Split s) const;  // windows per pass over the split
  int64_t tokens(Split s) const;
  int64_t documents(Split s) const;
  // Global training sample g (counting from 0 across epochs): out[seq_len + 1], and, when mask
  // is not null, mask[seq_len + 1] its loss mask (io/dataset_writer.hpp: 1 for a file without
  // one). A training sample whose targets (tokens 1 .. seq_len) are all masked is a fault
  // (below): it has nothing to learn (doc/data.md, "Loss masks").
  // With doc (document masking, DatasetExpectation::document_mask), doc[seq_len + 1] receives
  // for each token of the window where its document starts, counted from the window's first
  // token (0 for a document that began before the window).
  void train_sample(uint64_t seed, int64_t g, int32_t* out, uint8_t* mask = nullptr,
                    int32_t* doc = nullptr) const;
  // Validation sample k (fixed order, k < samples(validation)).
  void validation_sample(int64_t k, int32_t* out, uint8_t* mask = nullptr,
                         int32_t* doc = nullptr) const;

  // Faults found while reading, on this rank only (a token id >= the vocabulary, a failed
  // read, the file changed since it was opened, a training sample with no unmasked target):
  // the first one's message, "" when none. A
  // faulty window reads as token 0 so that nothing indexes outside a table; the trainer
  // drops the step and the caller gathers the message to rank 0 (comm/agree.hpp).
  const std::string& fault() const { return fault_; }
  // Records a fault when the file's size or modification time differ from those at open.
  void check_unchanged() const;
  // The files read: one, or the shards.
  const ShardSet& files() const { return *files_; }
  // The vocabulary the dataset was made with (tessera-prep's vocab_hash attribute).
  const std::string& vocab_hash() const { return vocab_hash_; }

 private:
  struct Segment {
    int64_t stream_begin, file_begin, length;  // a run of consecutive documents of one split
  };
  void read_window(const std::vector<Segment>& segments, int64_t stream_offset, int32_t* out,
                   uint8_t* mask) const;
  void read_stream(const std::vector<Segment>& segments, int64_t stream_offset, int64_t count,
                   uint32_t* dst, uint8_t* mask) const;
  // A dataset with a loss mask: every training sample has an unmasked target, or a collective
  // Error names the first that has none (reads the training split's mask once, split over
  // the ranks of comm).
  void require_targets(MPI_Comm comm) const;
  // The window's document starts (train_sample's doc) from a split's starts.
  void window_documents(const std::vector<int64_t>& starts, int64_t stream_offset,
                        int32_t* doc) const;

  std::string path_, vocab_hash_;
  int64_t seq_len_;
  mutable std::string fault_;
  std::unique_ptr<ShardSet> files_;  // file_begin of a segment is an offset of its stream
  std::vector<Segment> segments_[2];
  int64_t stream_tokens_[2] = {0, 0}, docs_[2] = {0, 0};
  std::vector<int64_t> doc_starts_[2];  // stream offset of each document (document masking)
};

}  // namespace tessera
