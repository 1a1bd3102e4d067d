// Scalar conversions between f32 and the 16-bit floating types, rounding to nearest even like
// the hardware instructions (and the CUDA backend's __float2bfloat16_rn / __float2half_rn),
// written on the bit patterns so the result does not depend on the compiler's half-precision
// support. constexpr, so that device code may call them too (nvcc --expt-relaxed-constexpr):
// the Kokkos cast kernels (kernels/kokkos), the CPU GEMM's widening and the bf16 reduction
// operator of comm/ use them.
#pragma once

#include <cstdint>
#include <bit>

namespace tessera::half {

constexpr uint32_t bits(float x) {
  return std::bit_cast<uint32_t>(x);
}

constexpr float from_bits(uint32_t u) {
  return std::bit_cast<float>(u);
}

constexpr uint16_t to_bf16(float x) {
  const uint32_t u = bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // NaN stays quiet NaN
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// The normal range is rebiased and rounded on the bits; below 2^-14 a float addition of 0.5
// does the subnormal rounding, since the ulp of 0.5 is 2^-24, the smallest half subnormal.
constexpr uint16_t to_f16(float x) {
  uint32_t u = bits(x);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u >= 0x47800000u)  // >= 65536 (or inf, NaN)
    return sign | (u > 0x7f800000u ? 0x7e00u : 0x7c00u);
  if (u < 0x38800000u) {  // below the smallest normal half, 2^-14
    const float magic = 0.5f;
    return sign | uint16_t(bits(from_bits(u) + magic) - bits(magic));
  }
  const uint32_t odd = (u >> 13) & 1u;
  u += (uint32_t(15 - 127) << 23) + 0xfffu + odd;
  return sign | uint16_t(u >> 13);
}

constexpr float from_f16(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    const float v = float(mant) * 0x1p-24f;
    return from_bits(sign | bits(v));
  }
  if (exp == 31) return from_bits(sign | 0x7f800000u | (mant << 13));
  return from_bits(sign | ((exp + 112) << 23) | (mant << 13));
}

constexpr float from_bf16(uint16_t h) {
  return from_bits(uint32_t(h) << 16);
}

}  // namespace tessera::half
