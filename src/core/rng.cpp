#include "core/rng.hpp"

#include <cmath>

namespace tessera {

Philox4x32 philox(Philox4x32 c, std::array<uint32_t, 2> k) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(kM0) * c[0];
    const uint64_t p1 = uint64_t(kM1) * c[2];
    c = {uint32_t(p1 >> 32) ^ c[1] ^ k[0], uint32_t(p1), uint32_t(p0 >> 32) ^ c[3] ^ k[1],
         uint32_t(p0)};
    k[0] += kW0;
    k[1] += kW1;
  }
  return c;
}

uint64_t hash_name(std::string_view name) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

CounterRng::CounterRng(uint64_t seed, std::string_view name) {
  const uint64_t h = hash_name(name) ^ (seed * 0x9E3779B97F4A7C15ull);
  key_ = {uint32_t(h), uint32_t(h >> 32)};
}

void CounterRng::normal_pair(uint64_t j, float* out) const {
  const Philox4x32 r = philox({uint32_t(j), uint32_t(j >> 32), 0u, 0u}, key_);
  // Two uniforms in (0,1] from 64 bits each; Box-Muller gives two normals.
  const double u1 = (double((uint64_t(r[0]) << 32 | r[1]) >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = double((uint64_t(r[2]) << 32 | r[3]) >> 11) * 0x1.0p-53;
  const double radius = std::sqrt(-2.0 * std::log(u1));
  const double angle = 6.283185307179586 * u2;
  out[0] = float(radius * std::cos(angle));
  out[1] = float(radius * std::sin(angle));
}

float CounterRng::normal(uint64_t index) const {
  float pair[2];
  normal_pair(index / 2, pair);
  return pair[index % 2];
}

uint64_t CounterRng::bits(uint64_t index) const {
  const Philox4x32 r = philox({uint32_t(index), uint32_t(index >> 32), 1u, 0u}, key_);
  return uint64_t(r[0]) << 32 | r[1];
}

double CounterRng::uniform(uint64_t index) const { return double(bits(index) >> 11) * 0x1.0p-53; }

}  // namespace tessera
