// The device of a run (kernels::Device), emulated devices, and the staging copies between host
// and device memory (kernels::transfer).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "core/error.hpp"
#include "kernels/backend.hpp"
#include "kernels/kernels.hpp"
#include "tensor/device_pool.hpp"

#ifdef TESSERA_CUDA
#include "kernels/cuda/context.hpp"
#endif

namespace tessera::kernels {
namespace {

// The blocks of every emulated device, by address: a tensor that says host but points into
// one lost its space on the way (a view made without it), which a GPU would fault on.
std::mutex blocks_mutex;
std::map<const char*, size_t> emulated_blocks;

// Host memory whose blocks say Space::cuda: the emulated device's RawMemory.
class EmulatedMemory : public RawMemory {
 public:
  void* allocate(size_t bytes) override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    std::lock_guard<std::mutex> lock(blocks_mutex);
    if (p) emulated_blocks[static_cast<const char*>(p)] = bytes;
    return p;
  }
  void release(void* p) override {
    {
      std::lock_guard<std::mutex> lock(blocks_mutex);
      emulated_blocks.erase(static_cast<const char*>(p));
    }
    std::free(p);
  }
  void zero(void* p, size_t bytes) override { std::memset(p, 0, bytes); }
  Space space() const override { return Space::cuda; }
};

}  // namespace

int cuda_emulated() {
  static const int n = [] {
    const char* s = std::getenv("TESSERA_EMULATE_CUDA");
    return s ? std::max(0, std::atoi(s)) : 0;
  }();
  return n;
}

bool in_emulated_device(const void* p) {
  if (cuda_emulated() == 0 || p == nullptr) return false;
  const char* c = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lock(blocks_mutex);
  auto it = emulated_blocks.upper_bound(c);
  if (it == emulated_blocks.begin()) return false;
  --it;
  return c < it->first + it->second;
}

struct Device::Impl {
  EmulatedMemory emulated_memory;
  std::unique_ptr<DevicePool> emulated_pool;
#ifdef TESSERA_CUDA
  std::unique_ptr<cuda::Context> context;
  std::unique_ptr<cuda::ContextScope> scope;
#endif
};

Device::Device(int index) : impl_(std::make_unique<Impl>()) {
  if (cuda_emulated() > 0) {
    impl_->emulated_pool = std::make_unique<DevicePool>(impl_->emulated_memory);
    return;
  }
#ifdef TESSERA_CUDA
  TESSERA_REQUIRE_LOCAL(cuda_device_count() > 0,
                        "hardware.device = cuda: no CUDA device is visible");
  impl_->context = std::make_unique<cuda::Context>(index);
  impl_->scope = std::make_unique<cuda::ContextScope>(*impl_->context);
#else
  (void)index;
  TESSERA_REQUIRE_LOCAL(false, "hardware.device = cuda: this build has no CUDA backend");
#endif
}

Device::~Device() = default;

DevicePool& Device::pool() {
#ifdef TESSERA_CUDA
  if (impl_->context) return impl_->context->pool();
#endif
  return *impl_->emulated_pool;
}

void* Device::compute_stream() {
#ifdef TESSERA_CUDA
  if (impl_->context) return impl_->context->stream();
#endif
  return nullptr;
}

void* Device::comm_stream() {
#ifdef TESSERA_CUDA
  if (impl_->context) return impl_->context->comm_stream();
#endif
  return nullptr;
}

bool Device::emulated() const {
  return impl_->emulated_pool != nullptr;
}

void Device::synchronize() {
#ifdef TESSERA_CUDA
  if (impl_->context) impl_->context->synchronize();
#endif
}

void transfer(const Tensor& src, const Tensor& dst, int64_t n) {
  TESSERA_REQUIRE_LOCAL(src.dtype == dst.dtype, "kernels::transfer: ", dtype_name(src.dtype),
                        " to ", dtype_name(dst.dtype), " (convert with kernels::cast)");
  TESSERA_REQUIRE_LOCAL(n <= src.numel() && n <= dst.numel(), "kernels::transfer: ", n,
                        " elements between ", src.shape.str(), " and ", dst.shape.str());
  if (n <= 0) return;
  for (const Tensor* t : {&src, &dst})
    TESSERA_REQUIRE_LOCAL(t->space != Space::host || !in_emulated_device(t->data),
                          "kernels::transfer: a tensor ", t->shape.str(),
                          " says host memory but is in (emulated) device memory");
  const size_t bytes = size_t(n) * dtype_size(src.dtype);
  const bool host = src.space == Space::host && dst.space == Space::host;
  if (host || cuda_emulated() > 0) {
    std::memmove(dst.data, src.data, bytes);
    return;
  }
#ifdef TESSERA_CUDA
  cuda::copy_bytes(dst.data, src.data, bytes, dst.space == Space::host);
#else
  TESSERA_REQUIRE_LOCAL(false,
                        "kernels::transfer: cuda memory in a build without the CUDA "
                        "backend");
#endif
}

}  // namespace tessera::kernels
