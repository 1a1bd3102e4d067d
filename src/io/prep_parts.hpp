// tessera-prep on several MPI ranks (doc/data.md, "Preparing on several ranks"): the inputs
// are split into contiguous runs of files, one run per rank; rank 0 tokenizes the first run
// straight into the dataset, every other rank its run into a part file beside the output,
// and rank 0 then appends the parts in rank order. The dataset therefore receives the same
// documents in the same order as on one rank, and is the same bytes.
//
// A part file is a sequence of records, little-endian, written and read on one machine kind:
//   'I' u64 input        the documents that follow belong to files[input]
//   'D' u64 n i64 masked u32 ids[n]
//   'E'                  the end: a part without it is incomplete
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "io/dataset_inputs.hpp"

namespace tessera {

// Which files each rank tokenizes: rank r takes files [first[r], first[r + 1]), the files whose
// middle byte falls in the r-th of `ranks` equal shares of the inputs' bytes (so a rank may
// take none, and one large file is never split).
std::vector<size_t> split_inputs(const std::vector<InputFile>& files, int ranks);

// The part file of `rank` for the dataset `out`.
std::string part_path(const std::string& out, int rank);

class PartWriter {
 public:
  explicit PartWriter(std::string path);  // creates (or truncates) the file
  ~PartWriter();                          // removes the file, finished or not
  PartWriter(const PartWriter&) = delete;
  PartWriter& operator=(const PartWriter&) = delete;

  void begin_input(size_t input);
  void add_document(std::span<const uint32_t> ids, int64_t masked);
  void finish();  // writes the end record and closes; throws a collective Error if writing failed

 private:
  void put(const void* data, size_t bytes);
  std::string path_;
  std::FILE* file_ = nullptr;
  std::vector<char> buffer_;
  bool failed_ = false;
};

// Reads a finished part in order. Throws a collective Error naming the file when it cannot be
// opened (the ranks do not share the output's directory) or is incomplete or malformed, or
// names an input index >= inputs.
void read_part(const std::string& path, size_t inputs, const std::function<void(size_t)>& begin,
               const std::function<void(std::span<const uint32_t>, int64_t)>& document);

}  // namespace tessera
