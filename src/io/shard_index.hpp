// Sharded datasets (doc/data.md, "Sharded datasets"): one dataset stored as many
// "tessera-dataset" files whose token streams, concatenated in order, are the dataset. A
// sharded dataset is named in data.path by
//  * its index, the file `tessera-prep --shard-tokens N --out NAME.h5` writes next to its
//    shards NAME-00000.h5, NAME-00001.h5, ...; or
//  * a list of dataset files separated by commas, each item a path or a pattern (`*`, `?`,
//    `[...]`, matches sorted by name), e.g. "web-*.h5" or "a.h5,b.h5".
// The index ("tessera-shard-index", version 1, HDF5) holds what the loader needs to lay the
// dataset out without opening a shard:
//   /doc_offsets   uint64 [n_docs + 1]: the concatenation's document offsets (as in a dataset)
//   /shard_tokens  uint64 [n_shards]: tokens of each shard
//   /shard_docs    uint64 [n_shards]: documents of each shard (shards end at document ends)
//   /shard_bytes   uint64 [n_shards]: each shard file's size in bytes
//   root attributes: format, version, tokenizer, vocab_size, eos_id, vocab_hash, n_docs,
//   n_tokens, n_shards, shards (the shard file names, relative to the index's directory, one
//   a line), manifest (as a dataset's).
// A list has no index: rank 0 reads each file's header and offsets at start, one file open at a
// time, and checks that all share one tokenizer and vocabulary.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/dataset_file.hpp"

namespace tessera {

inline constexpr const char* kShardIndexFormat = "tessera-shard-index";

// The layout of a sharded dataset, from its index or from reading a list's files.
struct ShardLayout {
  std::string tokenizer, vocab_hash;
  int64_t vocab = 0, eos = 0;
  std::vector<std::string> files;            // as the loader opens them
  std::vector<int64_t> tokens, docs, bytes;  // per shard
  std::vector<uint64_t> doc_offsets;         // of the concatenation: n_docs + 1 entries
  bool loss_mask = false;  // some file holds a loss mask (an index says so in its attribute)
};

// data.path names several files (a comma or a pattern character in it).
bool names_file_list(const std::string& spec);
// The files of a list, in order: items split at commas (white space around them dropped), a
// pattern replaced by its matches sorted by name. Errors: a pattern matching no file, an
// empty item, a file named twice.
std::vector<std::string> expand_file_list(const std::string& spec);
// path is an HDF5 file whose format attribute says it is a shard index.
bool is_shard_index(const std::string& path);

// Reads and checks an index (its tokenizer and vocabulary against the deck, its arrays
// against each other) and that each shard file exists with the size recorded. A
// tessera::Error names the index or the shard.
ShardLayout read_shard_index(const std::string& path, const DatasetExpectation& expect);
// Reads and checks each file of a list (every check of a one-file dataset), and that all share
// the first file's tokenizer and vocabulary; spec is data.path, for messages.
ShardLayout scan_file_list(const std::vector<std::string>& files, const std::string& spec,
                           const DatasetExpectation& expect);
// The file (at `which` place of the dataset) has the format of a dataset and the layout's
// tokenizer, vocabulary size and vocab_hash, else an Error naming it and `reference`, where
// the layout's came from (the list's first file, or the index).
void check_same_tokenizer(hid_t file, const std::string& path, const std::string& which,
                          const ShardLayout& layout, const std::string& reference);
// Writes the index of layout (its files named relative to the index's directory) to path, as
// path.tmp renamed when complete.
void write_shard_index(const std::string& path, const ShardLayout& layout,
                       const std::string& manifest);
// The name of shard i of the index `index_path`: NAME.h5 -> NAME-00012.h5 in its directory.
std::string shard_file_name(const std::string& index_path, int64_t i);

}  // namespace tessera
