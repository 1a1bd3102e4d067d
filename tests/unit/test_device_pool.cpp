// DevicePool's bookkeeping on a host-memory stand-in for cudaMalloc: per-category live and
// peak bytes as the host Allocator counts them, block reuse, the cache, and out-of-memory.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <set>

#include "core/error.hpp"
#include "tensor/device_pool.hpp"

namespace tessera {
namespace {

// Host memory with a capacity, recording what is outstanding.
class FakeMemory : public RawMemory {
 public:
  explicit FakeMemory(size_t capacity) : capacity_(capacity) {}
  ~FakeMemory() override { EXPECT_TRUE(blocks_.empty()) << "blocks never returned"; }
  void* allocate(size_t bytes) override {
    if (used_ + bytes > capacity_) return nullptr;
    void* p = std::malloc(bytes);
    std::memset(p, 0x5a, bytes);  // garbage, so zero() is observable
    used_ += bytes;
    sizes_[p] = bytes;
    blocks_.insert(p);
    return p;
  }
  void release(void* p) override {
    ASSERT_EQ(blocks_.erase(p), 1u);
    used_ -= sizes_[p];
    std::free(p);
  }
  void zero(void* p, size_t bytes) override { std::memset(p, 0, bytes); }
  Space space() const override { return Space::cuda; }
  size_t used() const { return used_; }

 private:
  size_t capacity_, used_ = 0;
  std::set<void*> blocks_;
  std::map<void*, size_t> sizes_;
};

TEST(DevicePool, ChargesRequestedBytesPerCategoryWithPeaks) {
  FakeMemory mem(1 << 20);
  DevicePool pool(mem);
  void* a = pool.allocate(1000, Charge::params);
  void* b = pool.allocate(3000, Charge::activations);
  void* c = pool.allocate(500, Charge::activations);
  EXPECT_EQ(pool.live(Charge::params), 1000u);
  EXPECT_EQ(pool.live(Charge::activations), 3500u);
  EXPECT_EQ(pool.live_total(), 4500u);
  pool.release(b);
  EXPECT_EQ(pool.live(Charge::activations), 500u);
  EXPECT_EQ(pool.peak(Charge::activations), 3500u);
  EXPECT_EQ(pool.peak_total(), 4500u);
  void* d = pool.allocate(200, Charge::grads);
  EXPECT_EQ(pool.peak_total(), 4500u);  // 1700 live now
  EXPECT_EQ(pool.live(Charge::grads), 200u);
  // Same figures as the host Allocator for the same sequence.
  Allocator host;
  void* ha = host.allocate(1000, Charge::params);
  void* hb = host.allocate(3000, Charge::activations);
  void* hc = host.allocate(500, Charge::activations);
  host.release(hb, 3000, Charge::activations);
  void* hd = host.allocate(200, Charge::grads);
  for (int k = 0; k < kChargeCount; ++k) {
    EXPECT_EQ(pool.live(Charge(k)), host.live(Charge(k))) << charge_name(Charge(k));
    EXPECT_EQ(pool.peak(Charge(k)), host.peak(Charge(k))) << charge_name(Charge(k));
  }
  EXPECT_EQ(pool.peak_total(), host.peak_total());
  host.release(ha, 1000, Charge::params);
  host.release(hc, 500, Charge::activations);
  host.release(hd, 200, Charge::grads);
  for (void* p : {a, c, d}) pool.release(p);
  EXPECT_EQ(pool.live_total(), 0u);
}

TEST(DevicePool, ReusesCachedBlocksOfSimilarSize) {
  FakeMemory mem(1 << 20);
  DevicePool pool(mem);
  void* a = pool.allocate(4096, Charge::workspace);
  EXPECT_EQ(pool.raw_allocations(), 1);
  EXPECT_EQ(pool.reserved(), 4096u);
  pool.release(a);
  EXPECT_EQ(pool.cached(), 4096u);
  EXPECT_EQ(pool.reserved(), 4096u);  // still held
  // 3584 rounds to 3584 >= 3/4 of 4096: the cached block is reused, charged as asked.
  void* b = pool.allocate(3584, Charge::comm);
  EXPECT_EQ(b, a);
  EXPECT_EQ(pool.raw_allocations(), 1);
  EXPECT_EQ(pool.cached(), 0u);
  EXPECT_EQ(pool.live(Charge::comm), 3584u);
  pool.release(b);
  // 1000 bytes would waste most of the 4096 block: a new one.
  void* c = pool.allocate(1000, Charge::comm);
  EXPECT_NE(c, a);
  EXPECT_EQ(pool.raw_allocations(), 2);
  EXPECT_EQ(pool.reserved(), 4096u + 1024u);
  EXPECT_EQ(pool.peak_reserved(), 4096u + 1024u);
  pool.release(c);
  pool.trim();
  EXPECT_EQ(pool.reserved(), 0u);
  EXPECT_EQ(pool.cached(), 0u);
  EXPECT_EQ(mem.used(), 0u);
  EXPECT_EQ(pool.peak_reserved(), 4096u + 1024u);
}

TEST(DevicePool, RoundsToGranuleAndZeroBytes) {
  FakeMemory mem(1 << 20);
  DevicePool pool(mem);
  void* a = pool.allocate(1, Charge::params);
  void* z = pool.allocate(0, Charge::params);
  EXPECT_NE(a, z);
  EXPECT_EQ(pool.reserved(), 2 * DevicePool::kGranule);
  EXPECT_EQ(pool.live(Charge::params), 1u);
  pool.release(a);
  pool.release(z);
  pool.release(nullptr);
}

TEST(DevicePool, TrimsCacheBeforeFailingAndNamesTheCategory) {
  FakeMemory mem(8192);
  DevicePool pool(mem);
  void* a = pool.allocate(4096, Charge::activations);
  pool.release(a);                                // cached: 4096 of the 8192 held
  void* b = pool.allocate(6144, Charge::params);  // fits only once the cache is returned
  EXPECT_EQ(pool.cached(), 0u);
  EXPECT_EQ(pool.reserved(), 6144u);
  try {
    pool.allocate(4096, Charge::optimizer);
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("device out of memory"), std::string::npos) << what;
    EXPECT_NE(what.find("optimizer"), std::string::npos) << what;
    EXPECT_NE(what.find("params 6144"), std::string::npos) << what;
    EXPECT_FALSE(e.collective());
  }
  EXPECT_EQ(pool.live(Charge::optimizer), 0u);
  pool.release(b);
}

TEST(DevicePool, RejectsForeignPointers) {
  FakeMemory mem(1 << 16);
  DevicePool pool(mem);
  int x = 0;
  EXPECT_THROW(pool.release(&x), std::logic_error);
}

TEST(DevicePool, BufferIsZeroedChargedAndReturned) {
  FakeMemory mem(1 << 16);
  DevicePool pool(mem);
  Allocator host;
  Allocator alloc(pool, host);
  {
    Buffer buf(alloc, Shape{10, 3}, DType::f32, Charge::grads);
    EXPECT_EQ(buf.view().space, Space::cuda);
    EXPECT_EQ(buf.numel() * 4, 30 * 4);
    EXPECT_EQ(pool.live(Charge::grads), 120u);
    EXPECT_THROW(buf.f32(), std::logic_error);  // host access to cuda memory is refused
    const float* host = static_cast<const float*>(buf.view().data);  // FakeMemory is host memory
    for (int64_t i = 0; i < buf.numel(); ++i) EXPECT_EQ(host[i], 0.0f);
    Buffer moved = std::move(buf);
    EXPECT_TRUE(buf.empty());
    EXPECT_EQ(pool.live(Charge::grads), 120u);
  }
  EXPECT_EQ(pool.live(Charge::grads), 0u);
  EXPECT_EQ(pool.cached(), DevicePool::kGranule);
}

TEST(DevicePool, DestructorReturnsLiveAndCachedBlocks) {
  FakeMemory mem(1 << 16);
  {
    DevicePool pool(mem);
    pool.allocate(100, Charge::params);  // never released: returned by ~DevicePool
    pool.release(pool.allocate(100, Charge::grads));
  }
  EXPECT_EQ(mem.used(), 0u);
}

}  // namespace
}  // namespace tessera
