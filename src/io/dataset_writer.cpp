#include "io/dataset_writer.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "core/error.hpp"
#include "io/h5.hpp"
#include "io/tokenizer.hpp"

namespace tessera {
namespace {

constexpr size_t kFlushTokens = size_t(1) << 20;

}  // namespace

std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (uint8_t(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(uint8_t(c)));
          out += buf;
        } else {
          out.push_back(c);
        }
    }
  }
  return out + "\"";
}

DatasetWriter::DatasetWriter(const std::string& path, const Tokenizer& tokenizer, bool split_lines,
                             int64_t chunk_tokens, bool loss_mask)
    : path_(path),
      tmp_path_(temporary_path(path)),
      kind_(tokenizer.kind()),
      vocab_hash_(tokenizer.vocab_hash()),
      vocab_size_(tokenizer.vocab_size()),
      eos_(tokenizer.eos_id()),
      split_lines_(split_lines),
      wide_(tokenizer.vocab_size() > 65536),
      loss_mask_(loss_mask),
      chunk_(chunk_tokens) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  TESSERA_REQUIRE(parent.empty() || std::filesystem::is_directory(parent), "output directory '",
                  parent.string(), "' of '", path, "' does not exist; create it first");
  file_ = std::make_unique<H5File>(H5File::create_for_large_attributes(tmp_path_));
  pending_.reserve(kFlushTokens);
  if (loss_mask_) mask_.reserve(kFlushTokens);
  flush();  // creates /tokens, even for an empty dataset
}

DatasetWriter::~DatasetWriter() {
  if (finished_) return;
  file_.reset();
  std::error_code ignored;
  std::filesystem::remove(tmp_path_, ignored);
}

void DatasetWriter::begin_input(const std::string& input_path, uint64_t bytes) {
  inputs_.push_back(Input{input_path, bytes});
}

void DatasetWriter::add_document(std::span<const uint32_t> ids, int64_t masked) {
  TESSERA_REQUIRE(masked >= 0 && size_t(masked) <= ids.size() && (loss_mask_ || masked == 0),
                  "internal: ", masked, " masked tokens of a document of ", ids.size());
  for (size_t done = 0; done < ids.size();) {  // in pieces: pending_ never grows
    const size_t n = std::min(ids.size() - done, kFlushTokens - pending_.size());
    pending_.insert(pending_.end(), ids.begin() + done, ids.begin() + done + n);
    if (loss_mask_)
      for (size_t i = done; i < done + n; ++i) mask_.push_back(int64_t(i) < masked ? 0 : 1);
    done += n;
    if (pending_.size() == kFlushTokens) flush();
  }
  pending_.push_back(uint32_t(eos_));
  if (loss_mask_) mask_.push_back(1);  // EOS is a target: the model learns to stop
  offsets_.push_back(offsets_.back() + ids.size() + 1);
  if (!inputs_.empty()) {
    inputs_.back().documents += 1;
    inputs_.back().tokens += int64_t(ids.size()) + 1;
  }
  if (pending_.size() >= kFlushTokens) flush();
}

void DatasetWriter::flush() {
  if (wide_) {
    file_->append("tokens", pending_.data(), int64_t(pending_.size()), chunk_);
  } else {
    narrow_.assign(pending_.begin(), pending_.end());
    file_->append("tokens", narrow_.data(), int64_t(narrow_.size()), chunk_);
  }
  if (loss_mask_) file_->append("loss_mask", mask_.data(), int64_t(mask_.size()), chunk_);
  pending_.clear();
  mask_.clear();
}

std::string DatasetWriter::manifest() const {
  std::string m = "{\"inputs\": [";
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const Input& in = inputs_[i];
    m += cat(i ? ", " : "", "{\"path\": ", json_quote(in.path), ", \"bytes\": ", in.bytes,
             ", \"documents\": ", in.documents, ", \"tokens\": ", in.tokens, "}");
  }
  return m + cat("], \"split_lines\": ", split_lines_ ? "true" : "false", "}");
}

void DatasetWriter::finish() {
  flush();
  file_->write("doc_offsets", {int64_t(offsets_.size())}, offsets_.data());
  file_->attr("format", std::string("tessera-dataset"));
  file_->attr("version", int64_t(loss_mask_ ? 2 : 1));
  file_->attr("tokenizer", kind_);
  file_->attr("vocab_size", vocab_size_);
  file_->attr("eos_id", eos_);
  file_->attr("vocab_hash", vocab_hash_);
  file_->attr("n_docs", documents());
  file_->attr("n_tokens", tokens());
  file_->attr("manifest", manifest());
  file_.reset();  // closes the file
  std::error_code ec;
  std::filesystem::rename(tmp_path_, path_, ec);
  TESSERA_REQUIRE(!ec, "cannot rename '", tmp_path_, "' to '", path_, "': ", ec.message());
  finished_ = true;
}

}  // namespace tessera
