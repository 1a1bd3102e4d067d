#include "io/token_dataset.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <tuple>
#include <utility>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "core/schema.hpp"
#include "io/h5_object.hpp"
#include "io/sample_order.hpp"

namespace tessera {
namespace {

// Root attributes every rank reads alike: a missing one is a collective error.
std::string string_attr(hid_t file, const char* name, const std::string& path) {
  TESSERA_REQUIRE(H5Aexists(file, name) > 0, "data file '", path, "' has no attribute '", name,
                  "'; is it a tessera-prep dataset?");
  return read_string_attr(file, name, "data file '" + path + "'");
}

int64_t int_attr(hid_t file, const char* name, const std::string& path) {
  TESSERA_REQUIRE(H5Aexists(file, name) > 0, "data file '", path, "' has no attribute '", name,
                  "'; is it a tessera-prep dataset?");
  return read_int_attr(file, name, "data file '" + path + "'");
}

// The file's size and modification time (ns), to notice a file changed under a running job.
std::pair<int64_t, int64_t> stamp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {-1, -1};
  return {int64_t(st.st_size), int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

// A dataset's extent when it is one-dimensional, -1 otherwise.
int64_t length_1d(hid_t set) {
  const hid_t space = H5Dget_space(set);
  const int nd = H5Sget_simple_extent_ndims(space);
  hsize_t n = 0;
  if (nd == 1) H5Sget_simple_extent_dims(space, &n, nullptr);
  H5Sclose(space);
  return nd == 1 ? int64_t(n) : -1;
}

// A document's split: a hash of its index, so the split never depends on the layout.
bool is_validation(int64_t doc, double fraction) {
  static const CounterRng rng(0, "data.split");
  return fraction > 0 && rng.uniform(uint64_t(doc)) < fraction;
}

}  // namespace

TokenDataset::TokenDataset(const std::string& path, MPI_Comm comm,
                           const DatasetExpectation& expect, double val_fraction)
    : path_(path), seq_len_(expect.seq_len), vocab_(expect.vocab) {
  // Every rank opens and checks the same file, so every fault below is seen by all ranks.
  // HDF5 errors reach the user as one line of ours, never as HDF5's error stack.
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  std::tie(size_, mtime_ns_) = stamp(path);
  TESSERA_REQUIRE(H5Fis_hdf5(path.c_str()) > 0, "cannot open data file '",
                  path, "' (data.path): missing, or not an HDF5 file made by tessera-prep");
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL);
  file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl);
  H5Pclose(fapl);
  TESSERA_REQUIRE(file_ >= 0, "cannot open data file '", path, "' (data.path)");

  const std::string format = string_attr(file_, "format", path);
  TESSERA_REQUIRE(format == "tessera-dataset", "data file '", path, "' has format '", format,
                  "', expected 'tessera-dataset' (make it with tessera-prep)");
  const int64_t version = int_attr(file_, "version", path);
  TESSERA_REQUIRE(version == 1, "data file '", path, "' has format version ", version,
                  "; this tessera reads version 1: prepare it again with this tessera-prep");
  const std::string tokenizer = string_attr(file_, "tokenizer", path);
  TESSERA_REQUIRE(tokenizer == expect.tokenizer, "data file '", path, "' was tokenized with '",
                  tokenizer, "' but data.tokenizer = ", expect.tokenizer);
  const int64_t vocab = int_attr(file_, "vocab_size", path);
  // A size model.vocab cannot take is damage, not advice to set the key to it.
  const KeySpec& key = *find_key("model.vocab");
  TESSERA_REQUIRE(double(vocab) >= key.min && double(vocab) <= key.max, "data file '", path,
                  "' has vocabulary size ", vocab,
                  ", which no model can have (model.vocab: ", key.allowed(),
                  "): its header is damaged; prepare it again with tessera-prep");
  TESSERA_REQUIRE(vocab == expect.vocab, "data file '", path, "' has vocabulary size ", vocab,
                  " but model.vocab = ", expect.vocab, "; set model.vocab = ", vocab);

  TESSERA_REQUIRE(H5Lexists(file_, "tokens", H5P_DEFAULT) > 0, "data file '", path,
                  "' has no dataset 'tokens'");
  tokens_ = H5Dopen2(file_, "tokens", H5P_DEFAULT);
  const int64_t n_tokens = length_1d(tokens_);
  TESSERA_REQUIRE(n_tokens >= 0, "data file '", path,
                  "': dataset 'tokens' must be one-dimensional (a stream of token ids)");
  const int64_t n_tokens_attr = int_attr(file_, "n_tokens", path);
  TESSERA_REQUIRE(n_tokens_attr == n_tokens, "data file '", path, "' says n_tokens = ",
                  n_tokens_attr, " but its dataset 'tokens' holds ", n_tokens,
                  ": the file is damaged or was not written by tessera-prep");
  const hid_t ftype = H5Dget_type(tokens_);
  const bool u16 = H5Tequal(ftype, H5T_STD_U16LE) > 0, u32 = H5Tequal(ftype, H5T_STD_U32LE) > 0;
  H5Tclose(ftype);
  TESSERA_REQUIRE(u16 || u32, "data file '", path,
                  "': dataset 'tokens' must be uint16 or uint32 little-endian");
  TESSERA_REQUIRE(u16 == (vocab <= 65536), "data file '", path, "': dataset 'tokens' is ",
                  u16 ? "uint16" : "uint32", " but a vocabulary of ", vocab, " needs ",
                  vocab <= 65536 ? "uint16" : "uint32");
  type_ = H5T_NATIVE_UINT32;

  TESSERA_REQUIRE(H5Lexists(file_, "doc_offsets", H5P_DEFAULT) > 0, "data file '", path,
                  "' has no dataset 'doc_offsets'");
  const hid_t offsets = H5Dopen2(file_, "doc_offsets", H5P_DEFAULT);
  const int64_t n = length_1d(offsets);
  std::vector<uint64_t> off(size_t(std::max<int64_t>(n, 0)));
  const herr_t read = H5Dread(offsets, H5T_NATIVE_UINT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, off.data());
  H5Dclose(offsets);
  TESSERA_REQUIRE(n >= 0 && read >= 0, "data file '", path,
                  "': dataset 'doc_offsets' must be a one-dimensional array of integers");
  TESSERA_REQUIRE(off.size() >= 2, "data file '", path, "' holds no documents");
  // Offsets start at 0, never decrease and end at the last token: every document lies inside
  // the token array.
  TESSERA_REQUIRE(off.front() == 0 && off.back() == uint64_t(n_tokens), "data file '", path,
                  "': doc_offsets run from ", off.front(), " to ", off.back(),
                  " but must run from 0 to the ", n_tokens, " stored tokens");
  const auto down = std::adjacent_find(off.begin(), off.end(), std::greater<uint64_t>());
  TESSERA_REQUIRE(down == off.end(), "data file '", path, "': doc_offsets decrease at entry ",
                  down - off.begin() + 1, " (", *down, " then ", *(down + 1),
                  "); the file is damaged");
  if (H5Aexists(file_, "n_docs") > 0) {
    const int64_t docs = int_attr(file_, "n_docs", path);
    TESSERA_REQUIRE(docs == int64_t(off.size()) - 1, "data file '", path, "' says n_docs = ",
                    docs, " but its doc_offsets hold ", off.size() - 1, " documents");
  }

  // Runs of consecutive documents of the same split become segments of that split's stream.
  for (size_t d = 0; d + 1 < off.size(); ++d) {
    const int s = is_validation(int64_t(d), val_fraction) ? validation : train;
    const int64_t begin = int64_t(off[d]), len = int64_t(off[d + 1] - off[d]);
    ++docs_[s];
    std::vector<Segment>& segs = segments_[s];
    if (!segs.empty() && segs.back().file_begin + segs.back().length == begin)
      segs.back().length += len;
    else
      segs.push_back({stream_tokens_[s], begin, len});
    stream_tokens_[s] += len;
  }
  TESSERA_REQUIRE(samples(train) >= expect.global_batch, "data file '", path, "' has ",
                  stream_tokens_[train], " training tokens, ", samples(train),
                  " samples of model.seq_len + 1 = ", seq_len_ + 1, " tokens: fewer than one "
                  "global batch (", expect.global_batch, " sequences)");
}

TokenDataset::~TokenDataset() {
  if (tokens_ >= 0) H5Dclose(tokens_);
  if (file_ >= 0) H5Fclose(file_);
}

int64_t TokenDataset::samples(Split s) const {
  return stream_tokens_[s] > seq_len_ ? (stream_tokens_[s] - 1) / seq_len_ : 0;
}
int64_t TokenDataset::tokens(Split s) const { return stream_tokens_[s]; }
int64_t TokenDataset::documents(Split s) const { return docs_[s]; }

void TokenDataset::read_window(const std::vector<Segment>& segments, int64_t stream_offset,
                               int32_t* out) const {
  // First segment containing stream_offset, then copy across segment boundaries.
  auto it = std::upper_bound(segments.begin(), segments.end(), stream_offset,
                             [](int64_t x, const Segment& s) { return x < s.stream_begin; });
  --it;
  int64_t need = seq_len_ + 1, pos = stream_offset;
  std::vector<uint32_t> buf(static_cast<size_t>(need));
  uint32_t* dst = buf.data();
  while (need > 0) {
    const int64_t within = pos - it->stream_begin;
    const int64_t count = std::min(need, it->length - within);
    const hsize_t start = hsize_t(it->file_begin + within), n = hsize_t(count);
    const hid_t fspace = H5Dget_space(tokens_);
    H5Sselect_hyperslab(fspace, H5S_SELECT_SET, &start, nullptr, &n, nullptr);
    const hid_t mspace = H5Screate_simple(1, &n, nullptr);
    const herr_t st = H5Dread(tokens_, type_, mspace, fspace, H5P_DEFAULT, dst);
    H5Sclose(mspace);
    H5Sclose(fspace);
    if (st < 0) {
      std::fill(dst, dst + count, 0u);
      check_unchanged();  // a file changed during the step: say so rather than "cannot read"
      if (fault_.empty())
        fault_ = cat("cannot read tokens [", start, ", ", start + n, ") of data file '", path_,
                     "' (truncated or changed while the run read it?)");
    }
    dst += count, need -= count, pos += count;
    ++it;
  }
  // Every id must index the embedding table: one comparison per token copied.
  for (size_t i = 0; i < buf.size(); ++i) {
    if (buf[i] >= uint64_t(vocab_)) [[unlikely]] {
      if (fault_.empty())
        fault_ = cat("data file '", path_, "' holds the token id ", buf[i],
                     ", outside the vocabulary of ", vocab_, " (model.vocab): the file is "
                     "damaged or was made for another model");
      buf[i] = 0;
    }
    out[i] = int32_t(buf[i]);
  }
}

void TokenDataset::check_unchanged() const {
  const auto [size, mtime] = stamp(path_);
  if (fault_.empty() && (size != size_ || mtime != mtime_ns_))
    fault_ = cat("data file '", path_, "' changed while the run was reading it (",
                 size < 0 ? std::string("now missing") : cat(size_, " -> ", size, " bytes"),
                 "); restore it, or prepare a new dataset and start a new run");
}

void TokenDataset::train_sample(uint64_t seed, int64_t g, int32_t* out) const {
  const int64_t n = samples(train);
  const SampleOrder order(uint64_t(n), seed, uint64_t(g / n));
  read_window(segments_[train], int64_t(order(uint64_t(g % n))) * seq_len_, out);
}

void TokenDataset::validation_sample(int64_t k, int32_t* out) const {
  read_window(segments_[validation], (k % samples(validation)) * seq_len_, out);
}

}  // namespace tessera
