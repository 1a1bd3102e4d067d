#include "tensor/device_pool.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/error.hpp"

namespace tessera {

DevicePool::~DevicePool() {
  for (auto& [p, b] : live_blocks_) raw_.release(p);
  for (auto& [size, p] : cache_) raw_.release(p);
}

void* DevicePool::allocate(size_t bytes, Charge c) {
  size_t size = std::max<size_t>((bytes + kGranule - 1) / kGranule * kGranule, kGranule);
  void* p = nullptr;
  // The smallest cached block that fits, if it is not much larger than asked.
  auto it = cache_.lower_bound(size);
  if (it != cache_.end() && it->first / 4 * 3 <= size) {
    p = it->second;
    size = it->first;
    cached_bytes_ -= size;
    cache_.erase(it);
  } else {
    p = raw_.allocate(size);
    if (!p && !cache_.empty()) {
      trim();
      p = raw_.allocate(size);
    }
    if (!p) {
      std::string live;
      for (int k = 0; k < kChargeCount; ++k)
        live += cat(k ? ", " : "", charge_name(Charge(k)), " ", ledger_.live(Charge(k)));
      TESSERA_REQUIRE_LOCAL(false, "device out of memory: ", bytes, " bytes asked for ",
                            charge_name(c), " with ", reserved_, " bytes reserved (live: ", live,
                            "); use a smaller micro-batch, recompute, or more model/ZeRO sharding");
    }
    ++raw_allocations_;
    reserved_ += size;
    peak_reserved_ = std::max(peak_reserved_, reserved_);
  }
  live_blocks_.emplace(p, Block{size, bytes, c});
  ledger_.add(bytes, c);
  return p;
}

void DevicePool::release(void* p) {
  if (!p) return;
  auto it = live_blocks_.find(p);
  if (it == live_blocks_.end())
    throw std::logic_error("DevicePool::release: pointer not allocated by this pool");
  ledger_.remove(it->second.bytes, it->second.charge);
  cache_.emplace(it->second.size, p);
  cached_bytes_ += it->second.size;
  live_blocks_.erase(it);
}

void DevicePool::trim() {
  for (auto& [size, p] : cache_) {
    raw_.release(p);
    reserved_ -= size;
  }
  cache_.clear();
  cached_bytes_ = 0;
}

}  // namespace tessera
