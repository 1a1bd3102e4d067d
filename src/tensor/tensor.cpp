#include "tensor/tensor.hpp"

#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>

#include "core/error.hpp"
#include "tensor/device_pool.hpp"

namespace tessera {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::f64:
      return 8;
    case DType::bf16:
    case DType::f16:
    case DType::u16:
      return 2;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
    case DType::u16:
      return "u16";
    case DType::f64:
      return "f64";
  }
  return "?";
}

const char* space_name(Space s) {
  return s == Space::host ? "host" : "cuda";
}

const char* charge_name(Charge c) {
  static const char* names[kChargeCount] = {"params",      "grads", "optimizer",
                                            "activations", "comm",  "workspace"};
  return names[int(c)];
}

Shape::Shape(std::initializer_list<int64_t> d) {
  if (d.size() > 4) throw std::logic_error("Shape: more than 4 dimensions");
  for (int64_t x : d) dims[ndim++] = x;
}

int64_t Shape::numel() const {
  if (ndim == 0) return 0;
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= dims[i];
  return n;
}

std::string Shape::str() const {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < ndim; ++i) os << (i ? ", " : "") << dims[i];
  os << "]";
  return os.str();
}

Tensor Tensor::rows(int64_t begin, int64_t count) const {
  Tensor t = *this;
  const int64_t row = numel() / shape[0];
  t.data = static_cast<char*>(data) + begin * row * int64_t(dtype_size(dtype));
  t.shape.dims[0] = count;
  return t;
}

Tensor Tensor::reshaped(Shape s) const {
  if (s.numel() != numel()) throw std::logic_error("reshape " + shape.str() + " -> " + s.str());
  Tensor t = *this;
  t.shape = s;
  return t;
}

Tensor Tensor::slice(int64_t begin, int64_t count) const {
  if (begin < 0 || count < 0 || begin + count > numel())
    throw std::logic_error("slice [" + std::to_string(begin) + ", " +
                           std::to_string(begin + count) + ") of " + shape.str());
  Tensor t = *this;
  t.data = static_cast<char*>(data) + begin * int64_t(dtype_size(dtype));
  t.shape = Shape{count};
  return t;
}

void* Tensor::host_data() const {
  if (space != Space::host && data != nullptr)
    throw std::logic_error("host access to a tensor " + shape.str() + " in " + space_name(space) +
                           " memory: copy it to host memory first (kernels::transfer)");
  return data;
}

Tensor view_of(const void* p, DType dtype, Shape s, Space space) {
  return Tensor{const_cast<void*>(p), dtype, space, s};
}
Tensor view_of(const float* p, Shape s, Space space) {
  return view_of(p, DType::f32, s, space);
}
Tensor view_of(const double* p, Shape s, Space space) {
  return view_of(p, DType::f64, s, space);
}
Tensor view_of(const int32_t* p, Shape s, Space space) {
  return view_of(p, DType::i32, s, space);
}

void MemoryLedger::add(size_t bytes, Charge c) {
  live_[int(c)] += bytes;
  peak_[int(c)] = std::max(peak_[int(c)], live_[int(c)]);
  peak_total_ = std::max(peak_total_, live_total());
}

void MemoryLedger::remove(size_t bytes, Charge c) {
  live_[int(c)] -= bytes;
}

size_t MemoryLedger::live_total() const {
  size_t s = 0;
  for (size_t x : live_) s += x;
  return s;
}

void* Allocator::allocate(size_t bytes, Charge c) {
  if (pool_) {  // the pool raises its own out-of-memory error, with the device's ledger
    void* p = pool_->allocate(bytes, c);
    pool_->raw().zero(p, bytes);
    ledger_.add(bytes, c);
    return p;
  }
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded ? rounded : 64);
  // Out of memory: the bytes asked for and held, not a bare std::bad_alloc (issue 19). Only
  // this rank knows, so the error is local (the job ends with its message).
  TESSERA_REQUIRE_LOCAL(p != nullptr, "out of memory: cannot allocate ",
                        double(bytes) / double(1 << 20), " MiB for ", charge_name(c),
                        " (this rank holds ", double(ledger_.live_total()) / double(1 << 20),
                        " MiB already); use a smaller model or train.micro_batch, or spread "
                        "it over more ranks");
  std::memset(p, 0, rounded);
  ledger_.add(bytes, c);
  return p;
}

void Allocator::release(void* p, size_t bytes, Charge c) {
  if (pool_)
    pool_->release(p);
  else
    std::free(p);
  ledger_.remove(bytes, c);
}

Buffer::Buffer(Allocator& alloc, Shape shape, DType dtype, Charge charge)
    : alloc_(&alloc), charge_(charge), bytes_(size_t(shape.numel()) * dtype_size(dtype)) {
  view_.data = alloc.allocate(bytes_, charge);
  view_.dtype = dtype;
  view_.space = alloc.space();
  view_.shape = shape;
}

Buffer::~Buffer() {
  if (alloc_ && view_.data) alloc_->release(view_.data, bytes_, charge_);
}

Buffer::Buffer(Buffer&& o) noexcept {
  *this = std::move(o);
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    if (alloc_ && view_.data) alloc_->release(view_.data, bytes_, charge_);
    alloc_ = o.alloc_;
    charge_ = o.charge_;
    bytes_ = o.bytes_;
    view_ = o.view_;
    o.alloc_ = nullptr;
    o.view_.data = nullptr;
  }
  return *this;
}

}  // namespace tessera
