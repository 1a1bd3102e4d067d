#include "io/token_dataset.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <tuple>
#include <utility>

#include "comm/raw_comm.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"
#include "io/sample_order.hpp"

namespace tessera {
namespace {

// A document's split: a hash of its index, so the split never depends on the layout.
bool is_validation(int64_t doc, double fraction) {
  static const CounterRng rng(0, "data.split");
  return fraction > 0 && rng.uniform(uint64_t(doc)) < fraction;
}

void broadcast(MPI_Comm comm, std::string& s) {
  uint64_t n = s.size();
  mpi::broadcast(comm, &n, sizeof n, 0);
  s.resize(n);
  mpi::broadcast(comm, s.data(), int64_t(n), 0);
}

template <class T>
void broadcast(MPI_Comm comm, std::vector<T>& v) {
  uint64_t n = v.size();
  mpi::broadcast(comm, &n, sizeof n, 0);
  v.resize(n);
  mpi::broadcast(comm, v.data(), int64_t(n * sizeof(T)), 0);
}

// A sharded dataset's layout, or none when path names one file: rank 0 reads the index or the
// list's files (the other ranks open nothing), and every rank gets its layout or its error.
std::optional<ShardLayout> shard_layout(const std::string& path, MPI_Comm comm,
                                        const DatasetExpectation& expect) {
  const int rank = mpi::rank(comm);
  int kind = 0;  // 0: one file, 1: sharded, -1: an error
  ShardLayout layout;
  std::string error;
  if (rank == 0) {
    try {
      if (names_file_list(path))
        layout = scan_file_list(expand_file_list(path), path, expect), kind = 1;
      else if (is_shard_index(path))
        layout = read_shard_index(path, expect), kind = 1;
    } catch (const std::exception& e) {
      kind = -1, error = e.what();
    }
  }
  mpi::broadcast(comm, &kind, sizeof kind, 0);
  if (kind < 0) {
    broadcast(comm, error);
    throw Error(error, __FILE__, __LINE__, true);
  }
  if (kind == 0) return std::nullopt;
  broadcast(comm, layout.tokenizer);
  broadcast(comm, layout.vocab_hash);
  mpi::broadcast(comm, &layout.vocab, sizeof layout.vocab, 0);
  uint64_t n = layout.files.size();
  mpi::broadcast(comm, &n, sizeof n, 0);
  layout.files.resize(n);
  for (std::string& f : layout.files) broadcast(comm, f);
  broadcast(comm, layout.tokens);
  broadcast(comm, layout.docs);
  broadcast(comm, layout.bytes);
  broadcast(comm, layout.doc_offsets);
  mpi::broadcast(comm, &layout.loss_mask, sizeof layout.loss_mask, 0);
  return layout;
}

}  // namespace

TokenDataset::TokenDataset(const std::string& path, MPI_Comm comm, const DatasetExpectation& expect,
                           double val_fraction, int max_open)
    : path_(path), seq_len_(expect.seq_len) {
  // HDF5 errors reach the user as one line of ours, never as HDF5's error stack.
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  std::vector<uint64_t> off;
  bool loss_mask = false;
  if (std::optional<ShardLayout> layout = shard_layout(path, comm, expect)) {
    off = std::move(layout->doc_offsets);
    layout->doc_offsets = off;
    loss_mask = layout->loss_mask;  // the shards' offsets are checked against them at first open
    vocab_hash_ = layout->vocab_hash;
    files_ = std::make_unique<ShardSet>(std::move(*layout), path, expect, max_open);
  } else {
    // Every rank opens and checks the same file, so every fault below is seen by all ranks.
    const std::pair<int64_t, int64_t> stamp = file_stamp(path);
    TESSERA_REQUIRE(H5Fis_hdf5(path.c_str()) > 0, "cannot open data file '", path,
                    "' (data.path): missing, or not an HDF5 file made by tessera-prep");
    const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL);
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl);
    H5Pclose(fapl);
    TESSERA_REQUIRE(file >= 0, "cannot open data file '", path, "' (data.path)");
    try {
      DatasetFileInfo info = check_dataset_file(file, path, expect);
      off = std::move(info.offsets);
      loss_mask = info.loss_mask;
      vocab_hash_ = info.vocab_hash;
      files_ = std::make_unique<ShardSet>(path, file, info.n_tokens, stamp, expect.vocab,
                                          info.loss_mask);
    } catch (...) {
      H5Fclose(file);
      throw;
    }
  }

  // Document masking needs documents: a dataset of one (doc_offsets = [0, n_tokens], say a
  // text without blank lines prepared without --split-lines) has no boundary to mask.
  TESSERA_REQUIRE(!expect.document_mask || off.size() > 2, "data.document_mask = true but '", path,
                  "' holds ", off.size() > 0 ? off.size() - 1 : 0,
                  " document (doc_offsets [0, n_tokens]): it has no document boundaries; "
                  "prepare it with its documents separated (blank lines, --split-lines, JSONL "
                  "records) or set data.document_mask = false");
  // Runs of consecutive documents of the same split become segments of that split's stream.
  for (size_t d = 0; d + 1 < off.size(); ++d) {
    const int s = is_validation(int64_t(d), val_fraction) ? validation : train;
    const int64_t begin = int64_t(off[d]), len = int64_t(off[d + 1] - off[d]);
    if (expect.document_mask) doc_starts_[s].push_back(stream_tokens_[s]);
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
  if (loss_mask) require_targets(comm);
}

void TokenDataset::require_targets(MPI_Comm comm) const {
  // Rank r scans windows [n r / R, n (r + 1) / R) of the training split, reading their targets'
  // mask (stream tokens k S + 1 .. k S + S of window k) in blocks of whole windows; the
  // lowest window without a target anywhere is reported by every rank.
  const int64_t n = samples(train), S = seq_len_;
  const int ranks = mpi::size(comm), rank = mpi::rank(comm);
  const int64_t first = n * rank / ranks, last = n * (rank + 1) / ranks;
  const int64_t per_block = std::max<int64_t>(1, (int64_t(1) << 20) / S);
  std::vector<uint32_t> ids;
  std::vector<uint8_t> mask;
  int64_t found = n;  // none
  for (int64_t k0 = first; k0 < last && found == n; k0 += per_block) {
    const int64_t k1 = std::min(last, k0 + per_block), count = (k1 - k0) * S;
    ids.resize(size_t(count)), mask.resize(size_t(count));
    read_stream(segments_[train], k0 * S + 1, count, ids.data(), mask.data());
    for (int64_t k = k0; k < k1 && found == n; ++k) {
      const uint8_t* m = mask.data() + (k - k0) * S;
      if (std::none_of(m, m + S, [](uint8_t v) { return v != 0; })) found = k;
    }
  }
  mpi::all_reduce_min(comm, &found);
  TESSERA_REQUIRE(
      found == n, "data file '", path_, "': training sample ", found, " (tokens ", found * S,
      " to ", (found + 1) * S, " of the training split) has no unmasked target: its ", S,
      " targets (model.seq_len) are all masked (a prompt longer than the sample); shorten the "
      "prompts, or raise model.seq_len");
}

int64_t TokenDataset::samples(Split s) const {
  return stream_tokens_[s] > seq_len_ ? (stream_tokens_[s] - 1) / seq_len_ : 0;
}
int64_t TokenDataset::tokens(Split s) const { return stream_tokens_[s]; }
int64_t TokenDataset::documents(Split s) const { return docs_[s]; }

void TokenDataset::read_window(const std::vector<Segment>& segments, int64_t stream_offset,
                               int32_t* out, uint8_t* mask) const {
  std::vector<uint32_t> buf(static_cast<size_t>(seq_len_ + 1));
  read_stream(segments, stream_offset, seq_len_ + 1, buf.data(), mask);
  for (size_t i = 0; i < buf.size(); ++i) out[i] = int32_t(buf[i]);
}

void TokenDataset::read_stream(const std::vector<Segment>& segments, int64_t stream_offset,
                               int64_t count, uint32_t* dst, uint8_t* mask) const {
  // First segment containing stream_offset, then copy across segment boundaries.
  auto it = std::upper_bound(segments.begin(), segments.end(), stream_offset,
                             [](int64_t x, const Segment& s) { return x < s.stream_begin; });
  --it;
  int64_t need = count, pos = stream_offset;
  while (need > 0) {
    const int64_t within = pos - it->stream_begin;
    const int64_t count = std::min(need, it->length - within);
    files_->read(it->file_begin + within, count, dst, mask, fault_);
    dst += count, need -= count, pos += count;
    if (mask) mask += count;
    ++it;
  }
}

void TokenDataset::window_documents(const std::vector<int64_t>& starts, int64_t stream_offset,
                                    int32_t* doc) const {
  // The last document starting at or before the window's first token, then each later start.
  auto it = std::upper_bound(starts.begin(), starts.end(), stream_offset);
  int32_t current = 0;
  for (int64_t i = 0; i <= seq_len_; ++i) {
    while (it != starts.end() && *it <= stream_offset + i) current = int32_t(*it++ - stream_offset);
    doc[i] = current;
  }
}

void TokenDataset::check_unchanged() const {
  files_->check_unchanged(fault_);
}

void TokenDataset::train_sample(uint64_t seed, int64_t g, int32_t* out, uint8_t* mask,
                                int32_t* doc) const {
  const int64_t n = samples(train);
  const SampleOrder order(uint64_t(n), seed, uint64_t(g / n));
  const int64_t k = int64_t(order(uint64_t(g % n)));
  read_window(segments_[train], k * seq_len_, out, mask);
  if (doc) window_documents(doc_starts_[train], k * seq_len_, doc);
  // Every sample must have a target: a window inside one long prompt has none, and would
  // train on nothing while counting as a sample (the same check on every layout: each rank
  // reads whole windows).
  if (mask && std::none_of(mask + 1, mask + seq_len_ + 1, [](uint8_t m) { return m != 0; }) &&
      fault_.empty())
    fault_ =
        cat("data file '", path_, "': training sample ", k, " (tokens ", k * seq_len_, " to ",
            (k + 1) * seq_len_, " of the training split) has no unmasked target: its ", seq_len_,
            " targets (model.seq_len) are all masked (a prompt longer than the "
            "sample); shorten the prompts, or raise model.seq_len");
}

void TokenDataset::validation_sample(int64_t k, int32_t* out, uint8_t* mask, int32_t* doc) const {
  const int64_t offset = (k % samples(validation)) * seq_len_;
  read_window(segments_[validation], offset, out, mask);
  if (doc) window_documents(doc_starts_[validation], offset, doc);
}

}  // namespace tessera
