#include "model/step_context.hpp"

#include <stdexcept>
#include <string>

#include "kernels/kernels.hpp"
#include "model/pass_pair.hpp"
#include "model/transfers.hpp"

namespace tessera {

Tensor Scratch::get(ScratchId id, Shape shape, DType dtype) {
  if (buffers_.empty()) buffers_.resize(size_t(ScratchId::count));
  Buffer& b = buffers_[size_t(id)];
  // Held as f32 words: the byte counts stay those of the f32 buffers the memory model assumes.
  const int64_t words = (shape.numel() * int64_t(dtype_size(dtype)) + 3) / 4;
  if (b.numel() < words) b = Buffer(alloc_, Shape{words}, DType::f32, Charge::workspace);
  return view_of(b.view().data, dtype, shape, b.view().space);
}

Tensor Scratch::readable(ScratchId id, const Tensor& t) {
  if (t.space == Space::host) return t;
  if (staging_.empty()) staging_.resize(size_t(ScratchId::count));
  Buffer& b = staging_[size_t(id)];
  const int64_t words = (t.numel() * int64_t(dtype_size(t.dtype)) + 3) / 4;
  if (b.numel() < words) b = Buffer(alloc_.host(), Shape{words}, DType::f32, Charge::workspace);
  const Tensor h = view_of(b.view().data, t.dtype, t.shape);
  kernels::transfer(t, h, t.numel());
  return h;
}

void StepContext::poll_transfers() {
  if (in_flight) in_flight->poll();
  if (pair) pair->poll_other();
}

StepContext StepContext::over(Scratch& other) const {
  StepContext c{alloc, par, other};
  c.slot = slot, c.batch = batch, c.training = training, c.loss_scale = loss_scale;
  c.hooks = hooks, c.reduce_partial_grads = reduce_partial_grads;
  c.weight_grads = weight_grads, c.in_flight = in_flight, c.pair = pair, c.docs = docs;
  return c;
}

int64_t rows_of(const Tensor& t, int64_t cols, const char* what) {
  if (t.shape.ndim != 2 || t.shape[1] != cols)
    throw std::logic_error(std::string(what) + ": expected [rows, " + std::to_string(cols) +
                           "], got " + t.shape.str());
  return t.shape[0];
}

}  // namespace tessera
