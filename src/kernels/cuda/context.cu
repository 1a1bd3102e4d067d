// Context (stream, cuBLAS handle, memory pool, scratch), the thread's current context, and
// cudaMalloc-backed memory for DevicePool.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/context.hpp"

namespace tessera::kernels::cuda {
namespace {

thread_local Context* current_context = nullptr;
constexpr size_t kCublasWorkspace = size_t(32) << 20;  // what cuBLAS asks for on Hopper

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" status
    return 0;
  }
  return n;
}

std::string pci_bus_id(int device) {
  char id[64] = {0};
  if (cudaDeviceGetPCIBusId(id, int(sizeof id), device) != cudaSuccess) {
    cudaGetLastError();
    return "cuda device " + std::to_string(device);
  }
  return id;
}

// ---- CudaMemory -------------------------------------------------------------------------------

void* CudaMemory::allocate(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return nullptr;
  }
  TESSERA_CUDA_CHECK(e);
  return p;
}

void CudaMemory::release(void* p) {
  // Kernels still queued may use the block: wait for them. Called only when the pool trims
  // its cache or is destroyed, never in a steady-state step. No throwing from destructors.
  cudaStreamSynchronize(stream_);
  cudaFree(p);
}

void CudaMemory::zero(void* p, size_t bytes) {
  TESSERA_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
}

// ---- Context ----------------------------------------------------------------------------------

struct Context::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  cudaStream_t comm_stream = nullptr;
  cublasHandle_t blas = nullptr;
  std::unique_ptr<CudaMemory> memory;
  std::unique_ptr<DevicePool> pool;
  void* cublas_workspace = nullptr;
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  int sm_count = 0;
  size_t max_shared = 0;
};

Context::Context(int device) : impl_(std::make_unique<Impl>()) {
  Impl& c = *impl_;
  if (device >= 0) TESSERA_CUDA_CHECK(cudaSetDevice(device));
  TESSERA_CUDA_CHECK(cudaGetDevice(&c.device));
  cudaDeviceProp prop{};
  TESSERA_CUDA_CHECK(cudaGetDeviceProperties(&prop, c.device));
  c.sm_count = prop.multiProcessorCount;
  c.max_shared = prop.sharedMemPerBlockOptin;
  TESSERA_CUDA_CHECK(cudaStreamCreate(&c.stream));
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&c.comm_stream, cudaStreamNonBlocking));
  c.memory = std::make_unique<CudaMemory>(c.stream);
  c.pool = std::make_unique<DevicePool>(*c.memory);
  TESSERA_CUBLAS_CHECK(detail::cublas().create(&c.blas));
  // Setting the stream resets the workspace to cuBLAS's own, so the stream goes first.
  TESSERA_CUBLAS_CHECK(detail::cublas().set_stream(c.blas, c.stream));
  TESSERA_CUBLAS_CHECK(detail::cublas().set_math_mode(c.blas, CUBLAS_DEFAULT_MATH));
  c.cublas_workspace = c.pool->allocate(kCublasWorkspace, Charge::workspace);
  TESSERA_CUBLAS_CHECK(
      detail::cublas().set_workspace(c.blas, c.cublas_workspace, kCublasWorkspace));
}

Context::~Context() {
  Impl& c = *impl_;
  if (current_context == this) current_context = nullptr;
  cudaStreamSynchronize(c.stream);
  if (c.blas) detail::cublas().destroy(c.blas);
  c.pool.reset();  // frees every block (waits for the stream first)
  c.memory.reset();
  cudaStreamSynchronize(c.comm_stream);
  cudaStreamDestroy(c.comm_stream);
  cudaStreamDestroy(c.stream);
}

int Context::device() const {
  return impl_->device;
}
CUstream_st* Context::stream() const {
  return impl_->stream;
}
CUstream_st* Context::comm_stream() const {
  return impl_->comm_stream;
}
cublasContext* Context::blas() const {
  return impl_->blas;
}
DevicePool& Context::pool() const {
  return *impl_->pool;
}
int Context::sm_count() const {
  return impl_->sm_count;
}
size_t Context::max_shared_per_block() const {
  return impl_->max_shared;
}

void Context::synchronize() const {
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
  TESSERA_CUDA_CHECK(cudaGetLastError());
}

void* Context::scratch(size_t bytes) {
  Impl& c = *impl_;
  if (bytes <= c.scratch_bytes) return c.scratch;
  // The pool hands the old block out again only to work queued after this point on the same
  // stream, so releasing it while kernels may still read it is safe.
  c.pool->release(c.scratch);
  c.scratch = nullptr;
  c.scratch_bytes = 0;
  const size_t grown = std::max(bytes, size_t(1) << 20);
  c.scratch = c.pool->allocate(grown, Charge::workspace);
  c.scratch_bytes = grown;
  return c.scratch;
}

// ---- current context ----------------------------------------------------------------------------

ContextScope::ContextScope(Context& ctx) : previous_(current_context) {
  TESSERA_CUDA_CHECK(cudaSetDevice(ctx.device()));
  current_context = &ctx;
}

ContextScope::~ContextScope() {
  current_context = previous_;
  if (previous_) cudaSetDevice(previous_->device());
}

Context& current() {
  TESSERA_REQUIRE_LOCAL(current_context != nullptr,
                        "a CUDA kernel was called with no current cuda::Context on this thread: "
                        "create a Context and hold a ContextScope for it around the calls");
  return *current_context;
}

void copy_bytes(void* dst, const void* src, size_t bytes, bool wait) {
  Context& ctx = current();
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, ctx.stream()));
  if (wait) ctx.synchronize();
}

}  // namespace tessera::kernels::cuda
