// The files a token dataset reads from, as one stream of tokens (doc/data.md, "Sharded
// datasets"): one file opened at start and held for the run, or the shards of a sharded
// dataset (io/shard_index.hpp), each opened at its first read, at most max_open at a time (the
// least recently read one is closed to open another). A shard is checked at its first open as a
// one-file dataset is at start (io/dataset_file.hpp) and against the layout (its tokens,
// documents and offsets); a fault there, a failed read or a file changed under the run is
// recorded on this rank, never thrown: the trainer drops the step and stops with it
// (TokenDataset::fault).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "io/shard_index.hpp"

namespace tessera {

class ShardSet {
 public:
  static constexpr int kDefaultMaxOpen = 64;

  // One file, opened and checked by the caller: the set closes file at the end. stamp: the
  // file's size and modification time when it was opened; vocab: model.vocab; loss_mask: the
  // file has one (version 2).
  ShardSet(const std::string& path, hid_t file, int64_t n_tokens, std::pair<int64_t, int64_t> stamp,
           int64_t vocab, bool loss_mask);
  // The shards of layout; name (data.path) and expect for messages and checks.
  ShardSet(ShardLayout layout, std::string name, const DatasetExpectation& expect,
           int max_open = kDefaultMaxOpen);
  ~ShardSet();
  ShardSet(const ShardSet&) = delete;
  ShardSet& operator=(const ShardSet&) = delete;

  // Tokens [begin, begin + count) of the stream into dst, each id checked against the
  // vocabulary as it is copied; a fault is recorded in fault (when empty, naming the file) and
  // the faulty tokens read as 0, so that nothing indexes outside a table. mask (when not null)
  // receives their loss mask: a file's /loss_mask, 1 for a file without one (a dataset may
  // list files with and without), 0 for faulty tokens.
  void read(int64_t begin, int64_t count, uint32_t* dst, uint8_t* mask, std::string& fault) const;
  void read(int64_t begin, int64_t count, uint32_t* dst, std::string& fault) const {
    read(begin, count, dst, nullptr, fault);
  }
  // Records a fault when an open file's size or modification time differ from its first open.
  void check_unchanged(std::string& fault) const;

  size_t shards() const { return shards_.size(); }
  int64_t tokens() const { return shards_.back().begin + shards_.back().tokens; }
  // For tests: files open now, the most ever open at once, and opens so far.
  int open_files() const { return int(open_.size()); }
  int max_open() const { return max_open_; }
  int most_open() const { return most_open_; }
  int64_t opens() const { return opens_; }

 private:
  struct Shard {
    std::string path;
    int64_t begin = 0, tokens = 0, doc_begin = 0, docs = 0, bytes = -1;
    hid_t file = -1, set = -1, mask = -1;  // mask: /loss_mask, when the file has one
    bool loss_mask = false;
    int64_t size = -1, mtime = -1;  // at its first open
    int64_t last_read = 0;
    bool checked = false, failed = false;
  };
  bool open(size_t i, std::string& fault) const;
  void close(size_t i) const;
  std::string where(size_t i) const;

  mutable std::vector<Shard> shards_;
  ShardLayout layout_;  // doc_offsets: a shard's are checked against them at its first open
  std::string name_;
  DatasetExpectation expect_;
  int max_open_ = 1;
  mutable std::vector<size_t> open_;
  mutable int64_t clock_ = 0, opens_ = 0;
  mutable int most_open_ = 0;
};

}  // namespace tessera
