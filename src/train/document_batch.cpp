#include "train/document_batch.hpp"

#include "kernels/kernels.hpp"

namespace tessera {

DocumentBatch::DocumentBatch(Allocator& alloc, const ModelConfig& cfg, int64_t micro_batch,
                             int64_t slots)
    : cfg_(cfg), B_(micro_batch) {
  const int64_t T = cfg.seq_len, rows = micro_batch * cfg.seq_local();
  Allocator& host = alloc.host();
  window_ = Buffer(host, Shape{micro_batch, T + 1}, DType::i32, Charge::workspace);
  start_ = Buffer(alloc, Shape{slots, rows}, DType::i32, Charge::workspace);
  start_seq_ = Buffer(alloc, Shape{slots, micro_batch * T}, DType::i32, Charge::workspace);
  position_ = Buffer(alloc, Shape{slots, rows}, DType::i32, Charge::workspace);
  if (alloc.space() != Space::host) {
    host_start_ = Buffer(host, Shape{slots, rows}, DType::i32, Charge::workspace);
    host_start_seq_ = Buffer(host, Shape{slots, micro_batch * T}, DType::i32, Charge::workspace);
    host_position_ = Buffer(host, Shape{slots, rows}, DType::i32, Charge::workspace);
  }
}

void DocumentBatch::store(int slot) {
  const int64_t T = cfg_.seq_len, rows = B_ * cfg_.seq_local();
  const bool staged = !host_start_.empty();
  int32_t* start = (staged ? host_start_ : start_).i32() + slot * rows;
  int32_t* start_seq = (staged ? host_start_seq_ : start_seq_).i32() + slot * B_ * T;
  int32_t* position = (staged ? host_position_ : position_).i32() + slot * rows;
  // Rows as the trainer lays out the tokens: [segment][sequence][token of the segment].
  int64_t n = 0;
  for (const ContextParallel::Segment& g : cfg_.cp.segments(T))
    for (int64_t b = 0; b < B_; ++b)
      for (int64_t t = 0; t < g.len; ++t, ++n) {
        const int64_t p = g.pos0 + t, s = window(b)[p];
        start[n] = int32_t(s);
        position[n] = int32_t(p - s);
      }
  for (int64_t b = 0; b < B_; ++b)
    for (int64_t p = 0; p < T; ++p) start_seq[b * T + p] = window(b)[p];
  if (staged) {
    kernels::transfer(host_start_.view().slice(slot * rows, rows),
                      start_.view().slice(slot * rows, rows), rows);
    kernels::transfer(host_start_seq_.view().slice(slot * B_ * T, B_ * T),
                      start_seq_.view().slice(slot * B_ * T, B_ * T), B_ * T);
    kernels::transfer(host_position_.view().slice(slot * rows, rows),
                      position_.view().slice(slot * rows, rows), rows);
  }
}

DocumentRows DocumentBatch::rows(int slot) const {
  if (!on()) return {};
  const int64_t T = cfg_.seq_len, rows = B_ * cfg_.seq_local();
  const Buffer& host_position = host_position_.empty() ? position_ : host_position_;
  return {start_.view().slice(slot * rows, rows), start_seq_.view().slice(slot * B_ * T, B_ * T),
          position_.view().slice(slot * rows, rows), host_position.i32() + slot * rows};
}

}  // namespace tessera
