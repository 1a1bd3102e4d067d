#include "io/shard_writer.hpp"

#include <algorithm>
#include <filesystem>

#include "core/error.hpp"
#include "io/tokenizer.hpp"

namespace tessera {

ShardedDatasetWriter::ShardedDatasetWriter(const std::string& index_path,
                                           const Tokenizer& tokenizer, bool split_lines,
                                           int64_t shard_tokens, bool loss_mask)
    : path_(index_path),
      tokenizer_(tokenizer),
      split_lines_(split_lines),
      loss_mask_(loss_mask),
      shard_tokens_(shard_tokens) {
  const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  TESSERA_REQUIRE(parent.empty() || std::filesystem::is_directory(parent), "output directory '",
                  parent.string(), "' of '", path_, "' does not exist; create it first");
  layout_.tokenizer = tokenizer.kind();
  layout_.vocab = tokenizer.vocab_size();
  layout_.eos = tokenizer.eos_id();
  layout_.vocab_hash = tokenizer.vocab_hash();
  layout_.doc_offsets = {0};
  layout_.loss_mask = loss_mask;
}

ShardedDatasetWriter::~ShardedDatasetWriter() {
  if (finished_) return;
  shard_.reset();  // removes its temporary file
  std::error_code ignored;
  for (const std::string& f : layout_.files) std::filesystem::remove(f, ignored);
}

void ShardedDatasetWriter::begin_input(const std::string& input_path, uint64_t bytes) {
  inputs_.push_back(Input{input_path, bytes});
  if (shard_) shard_->begin_input(input_path, bytes);
}

void ShardedDatasetWriter::add_document(std::span<const uint32_t> ids, int64_t masked) {
  if (!shard_) {
    // HDF5 stores the last chunk whole: chunks of about a sixteenth of a shard, from 4096
    // tokens to the usual 2^20, keep a small shard a small file.
    const int64_t chunk =
        std::clamp<int64_t>(shard_tokens_ / 16, 4096, DatasetWriter::kChunkTokens);
    shard_ = std::make_unique<DatasetWriter>(shard_file_name(path_, int64_t(layout_.files.size())),
                                             tokenizer_, split_lines_, chunk, loss_mask_);
    // The manifest of each shard names the input its documents come from.
    if (!inputs_.empty()) shard_->begin_input(inputs_.back().path, inputs_.back().bytes);
  }
  shard_->add_document(ids, masked);
  const int64_t n = int64_t(ids.size()) + 1;  // EOS included
  layout_.doc_offsets.push_back(layout_.doc_offsets.back() + uint64_t(n));
  if (!inputs_.empty()) inputs_.back().documents += 1, inputs_.back().tokens += n;
  if (shard_->tokens() >= shard_tokens_) close_shard();
}

void ShardedDatasetWriter::close_shard() {
  const std::string name = shard_file_name(path_, int64_t(layout_.files.size()));
  const int64_t tokens = shard_->tokens(), docs = shard_->documents();
  shard_->finish();
  shard_.reset();
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(name, ec);
  TESSERA_REQUIRE(!ec, "cannot read the size of the shard '", name, "': ", ec.message());
  layout_.files.push_back(name);
  layout_.tokens.push_back(tokens);
  layout_.docs.push_back(docs);
  layout_.bytes.push_back(int64_t(bytes));
}

void ShardedDatasetWriter::finish() {
  if (shard_) close_shard();
  std::string m = "{\"inputs\": [";
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const Input& in = inputs_[i];
    m += cat(i ? ", " : "", "{\"path\": ", json_quote(in.path), ", \"bytes\": ", in.bytes,
             ", \"documents\": ", in.documents, ", \"tokens\": ", in.tokens, "}");
  }
  m += cat("], \"split_lines\": ", split_lines_ ? "true" : "false", "}");
  write_shard_index(path_, layout_, m);
  finished_ = true;
}

}  // namespace tessera
