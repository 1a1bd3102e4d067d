#include "io/shard_index.hpp"

#include <glob.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <set>
#include <sstream>

#include "core/error.hpp"
#include "io/h5.hpp"
#include "io/h5_object.hpp"

namespace tessera {
namespace {

namespace fs = std::filesystem;

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

bool is_pattern(const std::string& s) {
  return s.find_first_of("*?[") != std::string::npos;
}

// A 1-D uint64 array of the index with n entries (n < 0: any length).
std::vector<uint64_t> read_array(const H5File& f, const char* name, int64_t n,
                                 const std::string& path) {
  const std::vector<int64_t> shape = f.shape(name);
  TESSERA_REQUIRE(shape.size() == 1 && (n < 0 || shape[0] == n), "shard index '", path,
                  "' is damaged: '", name, "' should hold ", n,
                  " entries; prepare the dataset again with tessera-prep --shard-tokens");
  std::vector<uint64_t> v(static_cast<size_t>(shape[0]));
  f.read(name, v.data());
  return v;
}

std::string position(size_t i, size_t n, const std::string& of) {
  return cat("shard ", i + 1, " of ", n, " of '", of, "'");
}

}  // namespace

bool names_file_list(const std::string& spec) {
  return spec.find(',') != std::string::npos || is_pattern(spec);
}

std::vector<std::string> expand_file_list(const std::string& spec) {
  std::vector<std::string> files;
  std::stringstream in(spec);
  for (std::string item; std::getline(in, item, ',');) {
    item = trim(item);
    TESSERA_REQUIRE(!item.empty(), "data.path = '", spec,
                    "' has an empty item; a list of files is 'a.h5,b.h5' or a pattern 'web-*.h5'");
    if (!is_pattern(item)) {
      files.push_back(item);
      continue;
    }
    glob_t g{};
    const int rc = ::glob(item.c_str(), GLOB_NOSORT, nullptr, &g);
    std::vector<std::string> found(g.gl_pathv, g.gl_pathv + (rc == 0 ? g.gl_pathc : 0));
    globfree(&g);
    TESSERA_REQUIRE(!found.empty(), "data.path: the pattern '", item,
                    "' matches no file; check the directory and the name");
    std::sort(found.begin(), found.end());  // by bytes, whatever the locale
    files.insert(files.end(), found.begin(), found.end());
  }
  std::set<std::string> seen;
  for (const std::string& f : files) {
    std::error_code ec;
    const std::string key = fs::weakly_canonical(fs::absolute(f, ec), ec).string();
    TESSERA_REQUIRE(seen.insert(ec ? f : key).second, "data.path = '", spec, "' names '", f,
                    "' twice; give each file of a dataset once");
  }
  return files;
}

bool is_shard_index(const std::string& path) {
  if (path.empty() || H5Fis_hdf5(path.c_str()) <= 0) return false;
  const H5Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (f.id < 0 || H5Aexists(f.id, "format") <= 0) return false;
  return read_string_attr(f.id, "format", "data file '" + path + "'") == kShardIndexFormat;
}

ShardLayout read_shard_index(const std::string& path, const DatasetExpectation& expect) {
  const H5File f = H5File::open_read(path);
  const std::string damaged = cat("shard index '", path, "' is damaged");
  const std::string again = "; prepare the dataset again with tessera-prep --shard-tokens";
  const int64_t version = f.attr_int("version");
  TESSERA_REQUIRE(version == 1, "shard index '", path, "' has format version ", version,
                  "; this tessera reads version 1: prepare it again with this tessera-prep");
  ShardLayout L;
  L.tokenizer = f.attr_string("tokenizer");
  TESSERA_REQUIRE(L.tokenizer == expect.tokenizer, "data file '", path, "' was tokenized with '",
                  L.tokenizer, "' but data.tokenizer = ", expect.tokenizer);
  L.vocab = f.attr_int("vocab_size");
  TESSERA_REQUIRE(L.vocab == expect.vocab, "data file '", path, "' has vocabulary size ", L.vocab,
                  " but model.vocab = ", expect.vocab, "; set model.vocab = ", L.vocab);
  L.eos = f.attr_int("eos_id");
  L.vocab_hash = f.attr_string("vocab_hash");
  L.loss_mask = f.has_attr("loss_mask") && f.attr_int("loss_mask") != 0;
  const int64_t n_shards = f.attr_int("n_shards"), n_docs = f.attr_int("n_docs"),
                n_tokens = f.attr_int("n_tokens");
  std::vector<std::string> names;
  std::stringstream list(f.attr_string("shards"));
  for (std::string name; std::getline(list, name);) names.push_back(name);
  TESSERA_REQUIRE(
      n_shards >= 1 && int64_t(names.size()) == n_shards && n_docs >= 1 && n_tokens >= 0, damaged,
      " (", names.size(), " shard names, n_shards = ", n_shards, ", n_docs = ", n_docs, ")", again);
  const std::vector<uint64_t> tokens = read_array(f, "shard_tokens", n_shards, path);
  const std::vector<uint64_t> docs = read_array(f, "shard_docs", n_shards, path);
  const std::vector<uint64_t> bytes = read_array(f, "shard_bytes", n_shards, path);
  L.doc_offsets = read_array(f, "doc_offsets", n_docs + 1, path);
  const std::vector<uint64_t>& off = L.doc_offsets;
  TESSERA_REQUIRE(
      off.front() == 0 && off.back() == uint64_t(n_tokens) &&
          std::adjacent_find(off.begin(), off.end(), std::greater<uint64_t>()) == off.end(),
      damaged, ": its doc_offsets do not run from 0 to n_tokens = ", n_tokens,
      " without decreasing", again);
  // Each shard ends where a document ends: its documents' tokens are its tokens.
  uint64_t doc = 0, tok = 0;
  const fs::path dir = fs::path(path).parent_path();
  for (size_t i = 0; i < size_t(n_shards); ++i) {
    doc += docs[i], tok += tokens[i];
    TESSERA_REQUIRE(docs[i] >= 1 && doc <= uint64_t(n_docs) && off[doc] == tok, damaged, ": ",
                    position(i, size_t(n_shards), path), " ends at document ", doc, ", token ", tok,
                    ", which is not where the offsets put it", again);
    TESSERA_REQUIRE(!names[i].empty() && names[i].find('/') == std::string::npos, damaged,
                    ": shard name '", names[i], "' is not a file name", again);
    L.files.push_back(dir.empty() ? names[i] : (dir / names[i]).string());
    L.tokens.push_back(int64_t(tokens[i]));
    L.docs.push_back(int64_t(docs[i]));
    L.bytes.push_back(int64_t(bytes[i]));
  }
  TESSERA_REQUIRE(doc == uint64_t(n_docs) && tok == uint64_t(n_tokens), damaged,
                  ": its shards hold ", doc, " documents and ", tok, " tokens but it says ", n_docs,
                  " and ", n_tokens, again);
  // A stat per shard, never an open: a missing or replaced shard stops the run before step 1.
  for (size_t i = 0; i < L.files.size(); ++i) {
    const int64_t size = file_stamp(L.files[i]).first;
    TESSERA_REQUIRE(size >= 0, "data shard '", L.files[i], "' (", position(i, L.files.size(), path),
                    ") is missing; restore it, or prepare the dataset again with tessera-prep "
                    "--shard-tokens");
    TESSERA_REQUIRE(size == L.bytes[i], "data shard '", L.files[i], "' (",
                    position(i, L.files.size(), path), ") has ", size,
                    " bytes but its index recorded ", L.bytes[i],
                    ": it was damaged or replaced; prepare the dataset again with tessera-prep "
                    "--shard-tokens");
  }
  return L;
}

ShardLayout scan_file_list(const std::vector<std::string>& files, const std::string& spec,
                           const DatasetExpectation& expect) {
  ShardLayout L;
  L.doc_offsets.push_back(0);
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string& p = files[i];
    const std::string which =
        cat("file ", i + 1, " of ", files.size(), " of data.path '", spec, "'");
    TESSERA_REQUIRE(H5Fis_hdf5(p.c_str()) > 0, "cannot open data file '", p, "' (", which,
                    "): missing, or not an HDF5 file made by tessera-prep");
    const H5Handle f(H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    TESSERA_REQUIRE(f.id >= 0, "cannot open data file '", p, "' (", which, ")");
    const std::string format = dataset_string_attr(f.id, "format", p);
    TESSERA_REQUIRE(format != kShardIndexFormat, "data file '", p,
                    "' is the index of a sharded dataset; name it alone in data.path (or in a "
                    "blend), not in a list of files");
    // One tokenizer and vocabulary for the whole dataset, said as such.
    if (i > 0) check_same_tokenizer(f.id, p, which, L, cat("'", files[0], "'"));
    const DatasetFileInfo info = check_dataset_file(f.id, p, expect);
    if (i == 0) L.tokenizer = info.tokenizer, L.vocab = info.vocab, L.vocab_hash = info.vocab_hash;
    const uint64_t base = L.doc_offsets.back();
    for (size_t d = 1; d < info.offsets.size(); ++d)
      L.doc_offsets.push_back(base + info.offsets[d]);
    L.files.push_back(p);
    L.tokens.push_back(info.n_tokens);
    L.docs.push_back(int64_t(info.offsets.size()) - 1);
    L.bytes.push_back(file_stamp(p).first);
    L.loss_mask = L.loss_mask || info.loss_mask;
  }
  return L;
}

void check_same_tokenizer(hid_t file, const std::string& path, const std::string& which,
                          const ShardLayout& layout, const std::string& reference) {
  const std::string format = dataset_string_attr(file, "format", path);
  TESSERA_REQUIRE(format == "tessera-dataset", "data file '", path, "' (", which, ") has format '",
                  format,
                  "', expected 'tessera-dataset' (make it with "
                  "tessera-prep)");
  const std::string tokenizer = dataset_string_attr(file, "tokenizer", path);
  const int64_t vocab = dataset_int_attr(file, "vocab_size", path);
  const std::string hash = H5Aexists(file, "vocab_hash") > 0
                               ? read_string_attr(file, "vocab_hash", "data file '" + path + "'")
                               : std::string();
  const bool same_hash = hash == layout.vocab_hash;
  TESSERA_REQUIRE(tokenizer == layout.tokenizer && vocab == layout.vocab && same_hash,
                  "data file '", path, "' (", which, ") was made with the tokenizer '", tokenizer,
                  "' and a vocabulary of ", vocab, same_hash ? "" : cat(" (vocab_hash ", hash, ")"),
                  ", but ", reference, " with '", layout.tokenizer, "' and ", layout.vocab,
                  same_hash ? "" : cat(" (vocab_hash ", layout.vocab_hash, ")"),
                  ": the files of one dataset must share one tokenizer and vocabulary");
}

void write_shard_index(const std::string& path, const ShardLayout& layout,
                       const std::string& manifest) {
  const std::string tmp = path + ".tmp";
  {
    H5File f = H5File::create_for_large_attributes(tmp);
    const int64_t n = int64_t(layout.files.size());
    std::vector<uint64_t> tokens(layout.tokens.begin(), layout.tokens.end());
    std::vector<uint64_t> docs(layout.docs.begin(), layout.docs.end());
    std::vector<uint64_t> bytes(layout.bytes.begin(), layout.bytes.end());
    f.write("doc_offsets", {int64_t(layout.doc_offsets.size())}, layout.doc_offsets.data());
    f.write("shard_tokens", {n}, tokens.data());
    f.write("shard_docs", {n}, docs.data());
    f.write("shard_bytes", {n}, bytes.data());
    std::string names;
    for (const std::string& file : layout.files) names += fs::path(file).filename().string() + "\n";
    f.attr("format", std::string(kShardIndexFormat));
    f.attr("version", int64_t(1));
    f.attr("tokenizer", layout.tokenizer);
    f.attr("vocab_size", layout.vocab);
    f.attr("eos_id", layout.eos);
    f.attr("vocab_hash", layout.vocab_hash);
    f.attr("n_docs", int64_t(layout.doc_offsets.size()) - 1);
    f.attr("n_tokens", int64_t(layout.doc_offsets.back()));
    f.attr("n_shards", n);
    f.attr("shards", names);
    f.attr("manifest", manifest);
    if (layout.loss_mask) f.attr("loss_mask", int64_t(1));  // absent: no shard has one
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  TESSERA_REQUIRE(!ec, "cannot rename '", tmp, "' to '", path, "': ", ec.message());
}

std::string shard_file_name(const std::string& index_path, int64_t i) {
  const fs::path p(index_path);
  const std::string stem = p.extension() == ".h5" ? p.stem().string() : p.filename().string();
  char number[32];
  std::snprintf(number, sizeof number, "-%05lld.h5", static_cast<long long>(i));
  return (p.parent_path() / (stem + number)).string();
}

}  // namespace tessera
