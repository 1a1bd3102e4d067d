// The inputs of tessera-prep and the documents in them.
//  * A text file: documents are separated by blank lines (empty or only spaces, tabs, \r),
//    or, with split_lines, each non-blank line is one document. A document keeps its inner
//    line breaks and loses the one after its last line ("\n" or "\r\n").
//  * A .jsonl file: one JSON object per line, whose "text" string is one document (other
//    members are checked as JSON and ignored; blank lines are skipped).
//  * A directory: every regular file inside, recursively, sorted by path.
// A UTF-8 byte order mark at the start of a file is dropped.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

struct InputFile {
  std::string path;
  uint64_t bytes = 0;
  bool jsonl = false;
};

// Throws a collective Error naming an input that does not exist or cannot be read.
std::vector<InputFile> expand_inputs(const std::vector<std::string>& paths);

// Throws a collective Error, before anything is written, when `out` cannot be the dataset
// written from `files`: it is empty, names a directory or an existing file that is not a
// regular file, or it or its temporary name (DatasetWriter::temporary_path) is one of the
// inputs (the same file by device and inode: through a symbolic or hard link, `./`, ...).
void require_output_apart(const std::string& out, const std::vector<InputFile>& files);

// Calls document(text) for each document of the file in order, and progress(bytes read so
// far) now and then and at the end. Throws a collective Error naming the file (and line)
// on unreadable or malformed input.
void for_each_document(const InputFile& file, bool split_lines,
                       const std::function<void(std::string_view)>& document,
                       const std::function<void(uint64_t)>& progress);

}  // namespace tessera
