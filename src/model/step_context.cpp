#include "model/step_context.hpp"

namespace tessera {

float* Scratch::get(int id, int64_t n) {
  if (id >= int(buffers_.size())) buffers_.resize(size_t(id) + 1);
  Buffer& b = buffers_[size_t(id)];
  if (b.numel() < n) b = Buffer(alloc_, Shape{n}, DType::f32, Charge::workspace);
  return b.f32();
}

}  // namespace tessera
