// Reads a "tessera-dataset" HDF5 file (written by tessera-prep; format in
// io/dataset_writer.hpp) for training: documents are split deterministically into train and
// validation by a hash of their index; each split is a stream of its documents' tokens;
// sample k of a split is the window of seq_len + 1 tokens at stream offset k * seq_len.
// Every rank reads only the hyperslabs of the samples it trains on (parallel HDF5).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <hdf5.h>
#include <mpi.h>

namespace tessera {

struct DatasetExpectation {
  std::string tokenizer;  // data.tokenizer
  int64_t vocab = 0;      // model.vocab
  int64_t seq_len = 0;
  int64_t global_batch = 0;
};

class TokenDataset {
 public:
  enum Split { train, validation };

  // Opens the file collectively on comm; collective Errors name the file and the mismatch.
  TokenDataset(const std::string& path, MPI_Comm comm, const DatasetExpectation& expect,
               double val_fraction);
  ~TokenDataset();
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;

  int64_t samples(Split s) const;  // windows per pass over the split
  int64_t tokens(Split s) const;
  int64_t documents(Split s) const;
  // Global training sample g (counting from 0 across epochs): out[seq_len + 1].
  void train_sample(uint64_t seed, int64_t g, int32_t* out) const;
  // Validation sample k (fixed order, k < samples(validation)).
  void validation_sample(int64_t k, int32_t* out) const;

  // Faults found while reading, on this rank only (a token id >= the vocabulary, a failed
  // read, the file changed since it was opened): the first one's message, "" when none. A
  // faulty window reads as token 0 so that nothing indexes outside a table; the trainer
  // drops the step and the caller gathers the message to rank 0 (comm/agree.hpp).
  const std::string& fault() const { return fault_; }
  // Records a fault when the file's size or modification time differ from those at open.
  void check_unchanged() const;

 private:
  struct Segment {
    int64_t stream_begin, file_begin, length;  // a run of consecutive documents of one split
  };
  void read_window(const std::vector<Segment>& segments, int64_t stream_offset, int32_t* out) const;

  std::string path_;
  int64_t seq_len_, vocab_;
  int64_t size_ = 0, mtime_ns_ = 0;  // of the file when opened
  mutable std::string fault_;
  hid_t file_ = -1, tokens_ = -1, type_ = -1;
  std::vector<Segment> segments_[2];
  int64_t stream_tokens_[2] = {0, 0}, docs_[2] = {0, 0};
};

}  // namespace tessera
