// The CUDA backend's context: what the kernel signatures cannot carry (the stream, the cuBLAS
// handle, scratch memory) comes from the calling thread's current Context, set by a
// ContextScope. Kernels on Space::cuda tensors (kernels/kernels.hpp) are queued on its stream and
// return without waiting, except sum_squares, which returns a host value; a kernel called with no
// current context raises tessera::Error. The kernels are one .cu file per family in this folder,
// registered in the cuda table (kernels/backend.hpp, backend.cu). Reductions are deterministic
// (fixed partition and order, no floating-point atomics); row statistics and parameter-gradient
// sums are accumulated in double like the CPU backend.
//
// Errors: CUDA and cuBLAS failures raise tessera::Error (local to the rank) naming the call;
// a fault inside a kernel surfaces at the next synchronising call (Context::synchronize()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tensor/device_pool.hpp"

struct CUstream_st;    // cudaStream_t is CUstream_st*
struct cublasContext;  // cublasHandle_t is cublasContext*

namespace tessera::kernels::cuda {

// Number of visible CUDA devices (0 when there is no driver or no device).
int device_count();
// The PCI bus id of a visible device ("0000:1b:00.0"): the same GPU has the same id in every
// process of a node, whatever CUDA_VISIBLE_DEVICES numbers it.
std::string pci_bus_id(int device);

// Device memory for a DevicePool: cudaMalloc/cudaFree; zero() is queued on `stream`, the
// stream the pool's blocks are used on.
class CudaMemory : public RawMemory {
 public:
  explicit CudaMemory(CUstream_st* stream) : stream_(stream) {}
  void* allocate(size_t bytes) override;  // nullptr when the device is out of memory
  void release(void* p) override;         // waits for the stream first
  void zero(void* p, size_t bytes) override;
  Space space() const override { return Space::cuda; }

 private:
  CUstream_st* stream_;
};

// One device's stream, cuBLAS handle and memory. Everything a Context's kernels allocate
// (cuBLAS workspace, scratch) comes from its pool(), charged to Charge::workspace; callers
// allocate their tensors from the same pool so one ledger covers the device.
class Context {
 public:
  // device < 0: the calling thread's current device. Creates a stream (blocking with respect
  // to the legacy default stream), a cuBLAS handle on it with TF32 off, and a 32 MiB cuBLAS
  // workspace.
  explicit Context(int device = -1);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int device() const;
  CUstream_st* stream() const;
  // A second stream, non-blocking, for collectives (NCCL) that overlap the kernels' stream.
  CUstream_st* comm_stream() const;
  cublasContext* blas() const;
  DevicePool& pool() const;
  int sm_count() const;
  size_t max_shared_per_block() const;  // opt-in limit of dynamic shared memory, bytes
  // Waits for the stream; raises any error a kernel on it hit.
  void synchronize() const;
  // At least `bytes` of device memory for one kernel call's temporaries, reused by the next
  // call (stream order makes that safe). Grows, never shrinks.
  void* scratch(size_t bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Makes ctx the calling thread's current context (and its device the current device) for this
// object's lifetime; the previous one is restored after.
class ContextScope {
 public:
  explicit ContextScope(Context& ctx);
  ~ContextScope();
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  Context* previous_;
};

// The calling thread's current context; tessera::Error when there is none.
Context& current();

// Copies bytes between any two spaces on the current context's stream (cudaMemcpyDefault);
// wait: returns only when the copy has finished (a copy into host memory that the host reads).
void copy_bytes(void* dst, const void* src, size_t bytes, bool wait);

}  // namespace tessera::kernels::cuda
