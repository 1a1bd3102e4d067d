// Document masking's inputs of a micro-batch (data.document_mask, doc/data.md "Document
// masks"): the loader fills each sample's window of document starts (TokenDataset), and this
// turns them into the rows the model reads (DocumentRows, model/step_context.hpp): each row's
// document start in global positions and its position in the document, in this rank's layout
// (context parallelism's segments, zigzag included), and the whole sequences' starts for
// Ulysses. One slot per micro-batch a step holds at once (the pipeline loads a step's
// micro-batches up front; one stage loads each just before its forward). Buffers are charged
// to workspace and sized once; without document masking nothing is allocated.
#pragma once

#include <cstdint>

#include "model/config.hpp"
#include "model/step_context.hpp"
#include "tensor/tensor.hpp"

namespace tessera {

class DocumentBatch {
 public:
  DocumentBatch() = default;  // document masking off
  DocumentBatch(Allocator& alloc, const ModelConfig& cfg, int64_t micro_batch, int64_t slots);

  bool on() const { return !window_.empty(); }
  // Sequence b's window of seq_len + 1 document starts, relative to the window's first token
  // (TokenDataset::train_sample's doc); null when off.
  int32_t* window(int64_t b) { return on() ? window_.i32() + b * (cfg_.seq_len + 1) : nullptr; }
  // Whether the token at position p of sequence b ends its document (the next token starts
  // one): its target, the next document's first token, is not predicted. False when off.
  bool ends_document(int64_t b, int64_t p) const {
    return on() && window_.i32()[b * (cfg_.seq_len + 1) + p + 1] == int32_t(p + 1);
  }
  // After the windows of a micro-batch are filled: its rows into slot `slot` (and onto the
  // device for a device run).
  void store(int slot);
  // The rows of slot `slot`; empty when off.
  DocumentRows rows(int slot) const;

 private:
  ModelConfig cfg_;
  int64_t B_ = 0;
  Buffer window_;                        // host [B, seq_len + 1]
  Buffer start_, start_seq_, position_;  // [slots, B x seq_local], [slots, B, seq_len], as start_
  Buffer host_start_, host_start_seq_, host_position_;  // their host copies (device run)
};

}  // namespace tessera
