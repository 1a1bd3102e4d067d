#include "io/dataset_file.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <functional>

#include "core/error.hpp"
#include "core/schema.hpp"
#include "io/h5_object.hpp"

namespace tessera {
namespace {

// A dataset's extent when it is one-dimensional, -1 otherwise.
int64_t length_1d(hid_t set) {
  const H5Handle space(H5Dget_space(set), H5Sclose);
  const int nd = H5Sget_simple_extent_ndims(space.id);
  hsize_t n = 0;
  if (nd == 1) H5Sget_simple_extent_dims(space.id, &n, nullptr);
  return nd == 1 ? int64_t(n) : -1;
}

}  // namespace

// Root attributes every rank reads alike: a missing one is a collective error.
std::string dataset_string_attr(hid_t file, const char* name, const std::string& path) {
  TESSERA_REQUIRE(H5Aexists(file, name) > 0, "data file '", path, "' has no attribute '", name,
                  "'; is it a tessera-prep dataset?");
  return read_string_attr(file, name, "data file '" + path + "'");
}

int64_t dataset_int_attr(hid_t file, const char* name, const std::string& path) {
  TESSERA_REQUIRE(H5Aexists(file, name) > 0, "data file '", path, "' has no attribute '", name,
                  "'; is it a tessera-prep dataset?");
  return read_int_attr(file, name, "data file '" + path + "'");
}

std::pair<int64_t, int64_t> file_stamp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {-1, -1};
  return {int64_t(st.st_size), int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

DatasetFileInfo check_dataset_file(hid_t file, const std::string& path,
                                   const DatasetExpectation& expect) {
  DatasetFileInfo info;
  const std::string format = dataset_string_attr(file, "format", path);
  TESSERA_REQUIRE(format == "tessera-dataset", "data file '", path, "' has format '", format,
                  "', expected 'tessera-dataset' (make it with tessera-prep)");
  const int64_t version = dataset_int_attr(file, "version", path);
  TESSERA_REQUIRE(version == 1 || version == 2, "data file '", path, "' has format version ",
                  version,
                  "; this tessera reads version 1 (2 with a loss mask): prepare it again "
                  "with this tessera-prep");
  info.tokenizer = dataset_string_attr(file, "tokenizer", path);
  TESSERA_REQUIRE(info.tokenizer == expect.tokenizer, "data file '", path, "' was tokenized with '",
                  info.tokenizer, "' but data.tokenizer = ", expect.tokenizer);
  info.vocab = dataset_int_attr(file, "vocab_size", path);
  // A size model.vocab cannot take is damage, not advice to set the key to it.
  const KeySpec& key = *find_key("model.vocab");
  TESSERA_REQUIRE(double(info.vocab) >= key.min && double(info.vocab) <= key.max, "data file '",
                  path, "' has vocabulary size ", info.vocab,
                  ", which no model can have (model.vocab: ", key.allowed(),
                  "): its header is damaged; prepare it again with tessera-prep");
  TESSERA_REQUIRE(info.vocab == expect.vocab, "data file '", path, "' has vocabulary size ",
                  info.vocab, " but model.vocab = ", expect.vocab,
                  "; set model.vocab = ", info.vocab);
  if (H5Aexists(file, "vocab_hash") > 0)
    info.vocab_hash = read_string_attr(file, "vocab_hash", "data file '" + path + "'");

  TESSERA_REQUIRE(H5Lexists(file, "tokens", H5P_DEFAULT) > 0, "data file '", path,
                  "' has no dataset 'tokens'");
  {
    const H5Handle tokens(H5Dopen2(file, "tokens", H5P_DEFAULT), H5Dclose);
    info.n_tokens = length_1d(tokens.id);
    TESSERA_REQUIRE(info.n_tokens >= 0, "data file '", path,
                    "': dataset 'tokens' must be one-dimensional (a stream of token ids)");
    const int64_t n_tokens_attr = dataset_int_attr(file, "n_tokens", path);
    TESSERA_REQUIRE(n_tokens_attr == info.n_tokens, "data file '", path,
                    "' says n_tokens = ", n_tokens_attr, " but its dataset 'tokens' holds ",
                    info.n_tokens, ": the file is damaged or was not written by tessera-prep");
    const H5Handle ftype(H5Dget_type(tokens.id), H5Tclose);
    const bool u16 = H5Tequal(ftype.id, H5T_STD_U16LE) > 0;
    const bool u32 = H5Tequal(ftype.id, H5T_STD_U32LE) > 0;
    TESSERA_REQUIRE(u16 || u32, "data file '", path,
                    "': dataset 'tokens' must be uint16 or uint32 little-endian");
    TESSERA_REQUIRE(u16 == (info.vocab <= 65536), "data file '", path, "': dataset 'tokens' is ",
                    u16 ? "uint16" : "uint32", " but a vocabulary of ", info.vocab, " needs ",
                    info.vocab <= 65536 ? "uint16" : "uint32");
  }

  // Version 2 adds the loss mask: one uint8 per token (doc/data.md, "Loss masks").
  info.loss_mask = version == 2;
  if (info.loss_mask) {
    TESSERA_REQUIRE(H5Lexists(file, "loss_mask", H5P_DEFAULT) > 0, "data file '", path,
                    "' is version 2 but has no dataset 'loss_mask'; the file is damaged: "
                    "prepare it again with tessera-prep");
    const H5Handle mask(H5Dopen2(file, "loss_mask", H5P_DEFAULT), H5Dclose);
    const H5Handle mtype(H5Dget_type(mask.id), H5Tclose);
    TESSERA_REQUIRE(length_1d(mask.id) == info.n_tokens && H5Tequal(mtype.id, H5T_STD_U8LE) > 0,
                    "data file '", path, "': dataset 'loss_mask' must be one uint8 per token (",
                    info.n_tokens, "); the file is damaged: prepare it again with tessera-prep");
  }

  TESSERA_REQUIRE(H5Lexists(file, "doc_offsets", H5P_DEFAULT) > 0, "data file '", path,
                  "' has no dataset 'doc_offsets'");
  std::vector<uint64_t>& off = info.offsets;
  herr_t read = -1;
  int64_t n = -1;
  {
    const H5Handle offsets(H5Dopen2(file, "doc_offsets", H5P_DEFAULT), H5Dclose);
    n = length_1d(offsets.id);
    off.resize(size_t(std::max<int64_t>(n, 0)));
    // A dataset of another shape is never read into this buffer.
    if (n >= 0)
      read = H5Dread(offsets.id, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, off.data());
  }
  TESSERA_REQUIRE(n >= 0 && read >= 0, "data file '", path,
                  "': dataset 'doc_offsets' must be a one-dimensional array of integers");
  TESSERA_REQUIRE(off.size() >= 2, "data file '", path, "' holds no documents");
  // Offsets start at 0, never decrease and end at the last token: every document lies inside
  // the token array.
  TESSERA_REQUIRE(off.front() == 0 && off.back() == uint64_t(info.n_tokens), "data file '", path,
                  "': doc_offsets run from ", off.front(), " to ", off.back(),
                  " but must run from 0 to the ", info.n_tokens, " stored tokens");
  const auto down = std::adjacent_find(off.begin(), off.end(), std::greater<uint64_t>());
  TESSERA_REQUIRE(down == off.end(), "data file '", path, "': doc_offsets decrease at entry ",
                  down - off.begin() + 1, " (", *down, " then ", *(down + 1),
                  "); the file is damaged");
  if (H5Aexists(file, "n_docs") > 0) {
    const int64_t docs = dataset_int_attr(file, "n_docs", path);
    TESSERA_REQUIRE(docs == int64_t(off.size()) - 1, "data file '", path, "' says n_docs = ", docs,
                    " but its doc_offsets hold ", off.size() - 1, " documents");
  }
  return info;
}

}  // namespace tessera
