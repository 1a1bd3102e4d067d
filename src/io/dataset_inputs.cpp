#include "io/dataset_inputs.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <utility>

#include "core/error.hpp"
#include "io/dataset_writer.hpp"
#include "io/json_reader.hpp"

namespace fs = std::filesystem;

namespace tessera {
namespace {

constexpr uint64_t kProgressEvery = uint64_t(1) << 16;  // bytes

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r\f\v") == std::string_view::npos;
}

std::string_view without_cr(std::string_view line) {
  return !line.empty() && line.back() == '\r' ? line.substr(0, line.size() - 1) : line;
}

InputFile input_file(const fs::path& p) {
  std::error_code ec;
  const uint64_t bytes = fs::file_size(p, ec);
  TESSERA_REQUIRE(!ec, "cannot read input '", p.string(), "': ", ec.message());
  return InputFile{p.string(), bytes, p.extension() == ".jsonl"};
}

// The document of one JSONL line.
std::string jsonl_text(const std::string& line, const std::string& path, int64_t number) {
  std::string text;
  bool found = false;
  try {
    JsonReader r(line);
    r.read_object([&](const std::string& key) {
      if (key != "text") return r.skip_value();
      TESSERA_REQUIRE(r.peek() == '"', "'", path, "' line ", number,
                      ": \"text\" is not a string; each line must be an object with a \"text\" "
                      "string");
      text = r.read_string();
      found = true;
    });
    r.expect_end();
  } catch (const JsonError& e) {
    TESSERA_REQUIRE(false, "'", path, "' line ", number, " is not valid JSON: ", e.what(),
                    " at column ", e.offset() + 1,
                    "; each line of a .jsonl file must be one JSON object");
  }
  TESSERA_REQUIRE(found, "'", path, "' line ", number,
                  " has no \"text\" member; each line must be an object with a \"text\" string");
  return text;
}

// The prompt and response of one JSONL line (for_each_record).
std::pair<std::string, std::string> jsonl_record(const std::string& line, const RecordFields& f,
                                                 const std::string& path, int64_t number) {
  const std::string want =
      cat("; with --loss-mask each line must be an object with a \"", f.prompt, "\" and a \"",
          f.response, "\" string (--prompt-field, --response-field name them)");
  std::string value[2];
  bool found[2] = {false, false};
  try {
    JsonReader r(line);
    r.read_object([&](const std::string& key) {
      const int i = key == f.prompt ? 0 : key == f.response ? 1 : -1;
      if (i < 0) return r.skip_value();
      TESSERA_REQUIRE(r.peek() == '"', "'", path, "' line ", number, ": \"", key,
                      "\" is not a string", want);
      value[i] = r.read_string();
      found[i] = true;
    });
    r.expect_end();
  } catch (const JsonError& e) {
    TESSERA_REQUIRE(false, "'", path, "' line ", number, " is not valid JSON: ", e.what(),
                    " at column ", e.offset() + 1, want);
  }
  for (int i : {0, 1})
    TESSERA_REQUIRE(found[i], "'", path, "' line ", number, " has no \"",
                    i == 0 ? f.prompt : f.response, "\" member", want);
  return {std::move(value[0]), std::move(value[1])};
}

}  // namespace

void for_each_record(const InputFile& file, const RecordFields& fields,
                     const std::function<void(std::string_view, std::string_view)>& record,
                     const std::function<void(uint64_t)>& progress) {
  TESSERA_REQUIRE(file.jsonl, "input '", file.path,
                  "' is not a .jsonl file; --loss-mask reads prompt/response records from .jsonl "
                  "files only");
  std::ifstream in(file.path, std::ios::binary);
  TESSERA_REQUIRE(in.good(), "cannot open input '", file.path, "'");
  std::string line;
  uint64_t done = 0, reported = 0;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    done += line.size() + (in.eof() ? 0 : 1);
    if (number == 1 && line.compare(0, 3, "\xEF\xBB\xBF") == 0) line.erase(0, 3);  // UTF-8 BOM
    if (!is_blank(line)) {
      const auto [prompt, response] = jsonl_record(line, fields, file.path, number);
      record(prompt, response);
    }
    if (done - reported >= kProgressEvery) progress(reported = done);
  }
  TESSERA_REQUIRE(in.eof(), "error reading input '", file.path, "' after line ", number);
  progress(done);
}

std::vector<InputFile> expand_inputs(const std::vector<std::string>& paths) {
  std::vector<InputFile> files;
  for (const std::string& path : paths) {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    TESSERA_REQUIRE(fs::exists(st), "input '", path,
                    "' does not exist; give text files, .jsonl files or directories");
    if (!fs::is_directory(st)) {
      TESSERA_REQUIRE(fs::is_regular_file(st), "input '", path, "' is not a regular file");
      files.push_back(input_file(path));
      continue;
    }
    std::vector<fs::path> inside;
    for (auto it = fs::recursive_directory_iterator(path, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
      if (it->is_regular_file()) inside.push_back(it->path());
    TESSERA_REQUIRE(!ec, "cannot list directory '", path, "': ", ec.message());
    std::sort(inside.begin(), inside.end(),
              [](const fs::path& a, const fs::path& b) { return a.string() < b.string(); });
    for (const fs::path& p : inside) files.push_back(input_file(p));
  }
  return files;
}

void require_output_apart(const std::string& out, const std::vector<InputFile>& files) {
  TESSERA_REQUIRE(!out.empty(), "--out is empty; pass --out OUT.h5, the dataset file to write");
  std::error_code ec;
  const fs::file_status st = fs::status(out, ec);
  TESSERA_REQUIRE(!fs::is_directory(st) && !fs::path(out).filename().empty(), "--out '", out,
                  "' names a directory; pass the name of the dataset file to write, e.g. --out ",
                  (fs::path(out) / "data.h5").string());
  TESSERA_REQUIRE(!fs::exists(st) || fs::is_regular_file(st), "--out '", out,
                  "' exists and is not a regular file; pass the name of a dataset file to write");
  const std::string tmp = DatasetWriter::temporary_path(out);
  for (const InputFile& f : files) {
    const auto same = [&](const std::string& path) {
      std::error_code ignored;
      return fs::equivalent(path, f.path, ignored);  // false when path does not exist
    };
    TESSERA_REQUIRE(!same(out), "--out '", out, "' is the input '", f.path,
                    "' (the same file); writing it would destroy the input; choose another "
                    "output name");
    TESSERA_REQUIRE(!same(tmp), "--out '", out, "' is written first as '", tmp,
                    "', which is the input '", f.path,
                    "' (the same file); choose another output name");
  }
}

void for_each_document(const InputFile& file, bool split_lines,
                       const std::function<void(std::string_view)>& document,
                       const std::function<void(uint64_t)>& progress) {
  std::ifstream in(file.path, std::ios::binary);
  TESSERA_REQUIRE(in.good(), "cannot open input '", file.path, "'");
  std::string line, doc;
  uint64_t done = 0, reported = 0;
  int64_t number = 0;
  bool in_doc = false;
  while (std::getline(in, line)) {
    ++number;
    done += line.size() + (in.eof() ? 0 : 1);
    if (number == 1 && line.compare(0, 3, "\xEF\xBB\xBF") == 0) line.erase(0, 3);  // UTF-8 BOM
    if (file.jsonl) {
      if (!is_blank(line)) document(jsonl_text(line, file.path, number));
    } else if (split_lines) {
      if (!is_blank(line)) document(without_cr(line));
    } else if (is_blank(line)) {
      if (in_doc) document(without_cr(doc));
      doc.clear();
      in_doc = false;
    } else {
      if (in_doc) doc.push_back('\n');
      doc += line;
      in_doc = true;
    }
    if (done - reported >= kProgressEvery) progress(reported = done);
  }
  TESSERA_REQUIRE(in.eof(), "error reading input '", file.path, "' after line ", number);
  if (in_doc) document(without_cr(doc));
  progress(done);
}

}  // namespace tessera
