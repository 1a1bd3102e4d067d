// Device memory with the host Allocator's accounting: every byte is charged to a category
// (params, grads, optimizer, activations, comm, workspace) with live and peak figures, so a GPU
// run reports its memory the way a CPU run does. Blocks are cached on release and reused, as
// cudaMalloc/cudaFree are slow and synchronise the device.
//
// The bookkeeping is independent of CUDA: the pool takes its blocks from a RawMemory, which is
// cudaMalloc in the CUDA backend (kernels/cuda/context.hpp, CudaMemory) and plain host
// memory in the unit test. A cached block is handed out again without any synchronisation, so
// a pool serves ONE stream: work queued on that stream is ordered after the kernels that used
// the block before. Memory shared with another stream must be synchronised by the caller.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <unordered_map>

#include "tensor/tensor.hpp"

namespace tessera {

// Where a pool's blocks come from.
class RawMemory {
 public:
  virtual ~RawMemory() = default;
  virtual void* allocate(size_t bytes) = 0;  // nullptr when out of memory
  virtual void release(void* p) = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  virtual Space space() const = 0;
};

class DevicePool {
 public:
  // Sizes are rounded up to kGranule bytes; a cached block is reused for a request of at least
  // 3/4 of its size (a little internal waste bought for reuse across similar sizes).
  static constexpr size_t kGranule = 512;

  explicit DevicePool(RawMemory& raw) : raw_(raw) {}
  ~DevicePool();  // returns every block, live or cached, to the RawMemory
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // Not zero-filled. Raises tessera::Error (local) when the RawMemory is exhausted even after
  // the cache is returned to it; the message lists live bytes per category.
  void* allocate(size_t bytes, Charge c);
  void release(void* p);  // p from allocate(); nullptr is ignored
  void trim();            // returns the cached (free) blocks to the RawMemory

  // Requested bytes, as the host Allocator counts them.
  size_t live(Charge c) const { return ledger_.live(c); }
  size_t peak(Charge c) const { return ledger_.peak(c); }
  size_t live_total() const { return ledger_.live_total(); }
  size_t peak_total() const { return ledger_.peak_total(); }
  const MemoryLedger& ledger() const { return ledger_; }
  // Bytes taken from the RawMemory (live blocks, rounded, plus the cache), now and at most.
  size_t reserved() const { return reserved_; }
  size_t peak_reserved() const { return peak_reserved_; }
  size_t cached() const { return cached_bytes_; }
  int64_t raw_allocations() const { return raw_allocations_; }  // calls that reached RawMemory
  RawMemory& raw() const { return raw_; }

 private:
  struct Block {
    size_t size;   // rounded
    size_t bytes;  // requested
    Charge charge;
  };
  RawMemory& raw_;
  MemoryLedger ledger_;
  std::unordered_map<void*, Block> live_blocks_;
  std::multimap<size_t, void*> cache_;  // free blocks by size
  size_t reserved_ = 0, peak_reserved_ = 0, cached_bytes_ = 0;
  int64_t raw_allocations_ = 0;
};

}  // namespace tessera
