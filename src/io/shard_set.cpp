#include "io/shard_set.hpp"

#include <algorithm>
#include <utility>

#include "core/error.hpp"

namespace tessera {
namespace {

std::string change(int64_t before, int64_t now) {
  return now < 0 ? std::string("now missing") : cat(before, " -> ", now, " bytes");
}

}  // namespace

ShardSet::ShardSet(const std::string& path, hid_t file, int64_t n_tokens,
                   std::pair<int64_t, int64_t> stamp, int64_t vocab, bool loss_mask)
    : name_(path) {
  expect_.vocab = vocab;
  Shard s;
  s.path = path, s.tokens = n_tokens, s.file = file, s.loss_mask = loss_mask;
  s.set = H5Dopen2(file, "tokens", H5P_DEFAULT);
  if (loss_mask) s.mask = H5Dopen2(file, "loss_mask", H5P_DEFAULT);
  s.size = stamp.first, s.mtime = stamp.second, s.checked = true;
  shards_.push_back(std::move(s));
  open_.push_back(0);
  most_open_ = 1, opens_ = 1;
}

ShardSet::ShardSet(ShardLayout layout, std::string name, const DatasetExpectation& expect,
                   int max_open)
    : layout_(std::move(layout)),
      name_(std::move(name)),
      expect_(expect),
      max_open_(std::max(max_open, 1)) {
  int64_t begin = 0, doc = 0;
  for (size_t i = 0; i < layout_.files.size(); ++i) {
    Shard s;
    s.path = layout_.files[i], s.begin = begin, s.tokens = layout_.tokens[i];
    s.doc_begin = doc, s.docs = layout_.docs[i], s.bytes = layout_.bytes[i];
    begin += s.tokens, doc += s.docs;
    shards_.push_back(std::move(s));
  }
  layout_.files.clear();  // kept in shards_
}

ShardSet::~ShardSet() {
  for (const size_t i : open_) close(i);
}

std::string ShardSet::where(size_t i) const {
  return cat("shard ", i + 1, " of ", shards_.size(), " of '", name_, "'");
}

void ShardSet::close(size_t i) const {
  Shard& s = shards_[i];
  if (s.set >= 0) H5Dclose(s.set);
  if (s.mask >= 0) H5Dclose(s.mask);
  if (s.file >= 0) H5Fclose(s.file);
  s.set = s.mask = s.file = -1;
}

bool ShardSet::open(size_t i, std::string& fault) const {
  Shard& s = shards_[i];
  s.last_read = ++clock_;
  if (s.set >= 0) return true;
  if (s.failed) return false;  // its fault is recorded once
  auto fail = [&](const std::string& what) {
    if (fault.empty()) fault = what;
    close(i);
    s.failed = true;
    return false;
  };
  // The least recently read file makes room.
  if (int(open_.size()) >= max_open_) {
    const auto lru = std::min_element(open_.begin(), open_.end(), [&](size_t a, size_t b) {
      return shards_[a].last_read < shards_[b].last_read;
    });
    close(*lru);
    open_.erase(lru);
  }
  const auto [size, mtime] = file_stamp(s.path);
  if (s.checked && (size != s.size || mtime != s.mtime))
    return fail(cat("data file '", s.path, "' changed while the run was reading it (",
                    change(s.size, size),
                    "); restore it, or prepare a new dataset and start a new run"));
  if (!s.checked && size != s.bytes)
    return fail(cat("data file '", s.path, "' (", where(i), ") changed since the run started (",
                    change(s.bytes, size),
                    "); restore it, or prepare a new dataset and start a new run"));
  s.file = H5Fopen(s.path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (s.file < 0)
    return fail(cat("cannot open data file '", s.path, "' (", where(i),
                    "): not an HDF5 file, or damaged; prepare the dataset again with "
                    "tessera-prep"));
  if (!s.checked) {
    // The checks of a one-file dataset, then the shard against the layout: its tokens,
    // documents and their offsets are those the run laid out.
    try {
      check_same_tokenizer(s.file, s.path, where(i), layout_,
                           names_file_list(name_) ? cat("the first file of data.path '", name_, "'")
                                                  : cat("its index '", name_, "'"));
      const DatasetFileInfo info = check_dataset_file(s.file, s.path, expect_);
      s.loss_mask = info.loss_mask;
      const auto first = layout_.doc_offsets.begin() + s.doc_begin;
      const bool same =
          info.n_tokens == s.tokens && int64_t(info.offsets.size()) == s.docs + 1 &&
          std::equal(info.offsets.begin(), info.offsets.end(), first,
                     [&](uint64_t a, uint64_t b) { return a == b - uint64_t(s.begin); });
      TESSERA_REQUIRE(same, "data file '", s.path, "' (", where(i), ") holds ", info.n_tokens,
                      " tokens in ", info.offsets.size() - 1, " documents, but '", name_,
                      "' laid out ", s.tokens, " tokens in ", s.docs,
                      " documents there: it was damaged or replaced; prepare the dataset again "
                      "with tessera-prep");
    } catch (const std::exception& e) {
      return fail(e.what());
    }
    s.checked = true, s.size = size, s.mtime = mtime;
  }
  s.set = H5Dopen2(s.file, "tokens", H5P_DEFAULT);
  if (s.loss_mask) s.mask = H5Dopen2(s.file, "loss_mask", H5P_DEFAULT);
  if (s.set < 0 || (s.loss_mask && s.mask < 0))
    return fail(cat("cannot open the tokens of data file '", s.path, "'"));
  open_.push_back(i);
  ++opens_;
  most_open_ = std::max(most_open_, int(open_.size()));
  return true;
}

void ShardSet::read(int64_t begin, int64_t count, uint32_t* dst, uint8_t* mask,
                    std::string& fault) const {
  // The shard holding begin, then on across shard boundaries.
  const auto holder = std::upper_bound(shards_.begin(), shards_.end(), begin,
                                       [](int64_t x, const Shard& s) { return x < s.begin; });
  size_t i = size_t(holder - shards_.begin()) - 1;
  while (count > 0) {
    const Shard& s = shards_[i];
    const int64_t within = begin - s.begin, n = std::min(count, s.tokens - within);
    herr_t st = -1;
    if (open(i, fault)) {
      const hsize_t start = hsize_t(within), len = hsize_t(n);
      const hid_t fspace = H5Dget_space(s.set);
      H5Sselect_hyperslab(fspace, H5S_SELECT_SET, &start, nullptr, &len, nullptr);
      const hid_t mspace = H5Screate_simple(1, &len, nullptr);
      st = H5Dread(s.set, H5T_NATIVE_UINT32, mspace, fspace, H5P_DEFAULT, dst);
      if (mask && s.loss_mask && st >= 0)
        st = H5Dread(s.mask, H5T_NATIVE_UINT8, mspace, fspace, H5P_DEFAULT, mask);
      else if (mask)
        std::fill(mask, mask + n, uint8_t(1));
      H5Sclose(mspace);
      H5Sclose(fspace);
      if (st < 0) {
        check_unchanged(fault);  // a file changed during the step: say so rather than "cannot read"
        if (fault.empty())
          fault = cat("cannot read tokens [", start, ", ", start + len, ") of data file '", s.path,
                      "' (truncated or changed while the run read it?)");
      }
    }
    if (st < 0) std::fill(dst, dst + n, 0u);
    if (st < 0 && mask) std::fill(mask, mask + n, uint8_t(0));
    // Every id must index the embedding table: one comparison per token copied.
    for (int64_t k = 0; k < n; ++k) {
      if (dst[k] >= uint64_t(expect_.vocab)) [[unlikely]] {
        if (fault.empty())
          fault = cat("data file '", s.path, "' holds the token id ", dst[k],
                      ", outside the vocabulary of ", expect_.vocab,
                      " (model.vocab): the file is damaged or was made for another model");
        dst[k] = 0;
      }
    }
    dst += n, begin += n, count -= n;
    if (mask) mask += n;
    ++i;
  }
}

void ShardSet::check_unchanged(std::string& fault) const {
  for (const size_t i : open_) {
    const Shard& s = shards_[i];
    const auto [size, mtime] = file_stamp(s.path);
    if (fault.empty() && (size != s.size || mtime != s.mtime))
      fault =
          cat("data file '", s.path, "' changed while the run was reading it (",
              change(s.size, size), "); restore it, or prepare a new dataset and start a new run");
  }
}

}  // namespace tessera
