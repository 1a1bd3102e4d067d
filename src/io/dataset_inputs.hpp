// The inputs of tessera-prep and the documents in them.
//  * A text file: documents are separated by blank lines (empty or only spaces, tabs, \r),
//    or, with split_lines, each non-blank line is one document. A document keeps its inner
//    line breaks and loses the one after its last line ("\n" or "\r\n").
//  * A .jsonl file: one JSON object per line, whose "text" string is one document (other
//    members are checked as JSON and ignored; blank lines are skipped).
//  * A directory: every regular file inside, recursively, sorted by path.
// A UTF-8 byte order mark at the start of a file is dropped.
// Prompt/response records (tessera-prep --loss-mask, doc/data.md "Loss masks"): each line of
// a .jsonl file is an object with two string members, a prompt and a response (named by
// RecordFields), read by for_each_record.
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

// The names of a record's two members (--prompt-field, --response-field).
struct RecordFields {
  std::string prompt = "prompt", response = "response";
};

// Calls record(prompt, response) for each record of the .jsonl file in order (blank lines
// skipped), and progress as for_each_document does. Throws a collective Error naming the file
// and line when a line is not a JSON object, lacks either member or holds one that is not a
// string.
void for_each_record(const InputFile& file, const RecordFields& fields,
                     const std::function<void(std::string_view, std::string_view)>& record,
                     const std::function<void(uint64_t)>& progress);

}  // namespace tessera
