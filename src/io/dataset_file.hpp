// The checks of one "tessera-dataset" file (format in io/dataset_writer.hpp), shared by a
// dataset of one file and each shard of a sharded one (io/shard_set.hpp): the format and
// version, the tokenizer and vocabulary against the deck, the token array's shape and type,
// and the document offsets. They read the offsets and a few attributes, never the tokens.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tessera {

struct DatasetExpectation {
  std::string tokenizer;  // data.tokenizer
  int64_t vocab = 0;      // model.vocab
  int64_t seq_len = 0;
  int64_t global_batch = 0;
  // data.document_mask: the dataset must hold more than one document, and samples report
  // where their documents start (TokenDataset::train_sample).
  bool document_mask = false;
};

// What the checks of a file found.
struct DatasetFileInfo {
  std::string tokenizer, vocab_hash;
  int64_t vocab = 0, n_tokens = 0;
  bool loss_mask = false;         // version 2: /loss_mask, uint8 [n_tokens]
  std::vector<uint64_t> offsets;  // doc_offsets: n_docs + 1 entries from 0 to n_tokens
};

// Checks the open file `file` (named `path` in messages); a tessera::Error names the file and
// the fault. Every rank that reads the same file raises the same error.
DatasetFileInfo check_dataset_file(hid_t file, const std::string& path,
                                   const DatasetExpectation& expect);

// A root attribute every tessera dataset or shard index has ("format", "version", ...), as a
// collective error naming the file when missing.
std::string dataset_string_attr(hid_t file, const char* name, const std::string& path);
int64_t dataset_int_attr(hid_t file, const char* name, const std::string& path);

// The file's size and modification time (ns), {-1, -1} when it cannot be seen: to notice a
// file changed under a running job.
std::pair<int64_t, int64_t> file_stamp(const std::string& path);

}  // namespace tessera
