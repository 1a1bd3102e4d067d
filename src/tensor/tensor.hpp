// Typed views over memory, and the allocator that charges every byte to a category so a
// run can report its memory per category (params, grads, optimizer, activations, comm,
// workspace) with high-water marks.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace tessera {

enum class DType { f32, bf16, f16, i32, u16, f64 };
enum class Space { host, cuda };
enum class Charge { params, grads, optimizer, activations, comm, workspace };
constexpr int kChargeCount = 6;

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "f32", "bf16", ...
const char* space_name(Space s);  // "host", "cuda"
const char* charge_name(Charge c);

// Up to four dimensions, row-major.
struct Shape {
  std::array<int64_t, 4> dims{0, 0, 0, 0};
  int ndim = 0;
  Shape() = default;
  Shape(std::initializer_list<int64_t> d);
  int64_t numel() const;
  int64_t operator[](int i) const { return dims[i]; }
  bool operator==(const Shape& o) const { return ndim == o.ndim && dims == o.dims; }
  std::string str() const;  // "[2, 3]"
};

// A non-owning view. Owners are Buffers (below) or the caller.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  Space space = Space::host;
  Shape shape;

  int64_t numel() const { return shape.numel(); }
  // Host access: the elements as host code reads and writes them. A tensor in cuda memory
  // raises std::logic_error here, so a host loop that misses its staging copy
  // (kernels::transfer) fails, also where emulated device memory would let it work.
  float* f32() const { return static_cast<float*>(host_data()); }
  int32_t* i32() const { return static_cast<int32_t*>(host_data()); }
  // The pointer in any space, for pointer arithmetic and views in the tensor's space (flat
  // parameter and shard buffers); never read on the host, never given to comm/ (which takes
  // Tensors, so a device tensor goes through NCCL or staging: doc/cuda.md).
  float* ptr_f32() const { return static_cast<float*>(data); }
  // Rows [begin, begin+count) of the outermost dimension.
  Tensor rows(int64_t begin, int64_t count) const;
  Tensor reshaped(Shape s) const;
  // Elements [begin, begin+count) of the flattened tensor, as a 1-D view (the flat parameter,
  // gradient and shard buffers are cut this way).
  Tensor slice(int64_t begin, int64_t count) const;

 private:
  void* host_data() const;
};

// A view of memory the caller owns, typed by the pointer. Tensor carries no const: a kernel's
// inputs are views it only reads, which its signature says.
Tensor view_of(const float* p, Shape s, Space space = Space::host);
Tensor view_of(const double* p, Shape s, Space space = Space::host);
Tensor view_of(const int32_t* p, Shape s, Space space = Space::host);
Tensor view_of(const void* p, DType dtype, Shape s, Space space = Space::host);

// Live and peak bytes per category, and the peak of their sum: the bookkeeping shared by the
// host Allocator and the device pool (tensor/device_pool.hpp).
class MemoryLedger {
 public:
  void add(size_t bytes, Charge c);
  void remove(size_t bytes, Charge c);
  size_t live(Charge c) const { return live_[int(c)]; }
  size_t peak(Charge c) const { return peak_[int(c)]; }
  size_t live_total() const;
  size_t peak_total() const { return peak_total_; }

 private:
  std::array<size_t, kChargeCount> live_{}, peak_{};
  size_t peak_total_ = 0;
};

class DevicePool;

// Memory of one space for one rank, tracking live and peak bytes per category. The default is
// host memory; constructed on a DevicePool, its buffers are the pool's (cuda memory, or host
// memory standing in for it under emulation, kernels::Device) and host() is the allocator of
// the host staging buffers that copies to and from them go through.
class Allocator {
 public:
  Allocator() = default;
  Allocator(DevicePool& pool, Allocator& host) : pool_(&pool), host_(&host) {}
  Space space() const { return pool_ ? Space::cuda : Space::host; }
  // Host memory for staging (itself when it is host memory).
  Allocator& host() { return host_ ? *host_ : *this; }
  void* allocate(size_t bytes, Charge c);  // zero-filled
  void release(void* p, size_t bytes, Charge c);
  size_t live(Charge c) const { return ledger_.live(c); }
  size_t peak(Charge c) const { return ledger_.peak(c); }
  size_t live_total() const { return ledger_.live_total(); }
  size_t peak_total() const { return ledger_.peak_total(); }
  const MemoryLedger& ledger() const { return ledger_; }

 private:
  MemoryLedger ledger_;
  DevicePool* pool_ = nullptr;
  Allocator* host_ = nullptr;
};

// An owning allocation in the allocator's space, charged to a category, 64-byte aligned,
// zero-filled.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Allocator& alloc, Shape shape, DType dtype, Charge charge);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  const Tensor& view() const { return view_; }
  float* f32() const { return view_.f32(); }  // host access (Tensor::f32)
  int32_t* i32() const { return view_.i32(); }
  float* ptr_f32() const { return view_.ptr_f32(); }
  int64_t numel() const { return view_.numel(); }
  bool empty() const { return view_.data == nullptr; }

 private:
  Allocator* alloc_ = nullptr;
  Charge charge_ = Charge::workspace;
  size_t bytes_ = 0;
  Tensor view_;
};

}  // namespace tessera
