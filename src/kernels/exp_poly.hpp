// The exponential both kernel families compute, written once: exp(x) = 2^n exp(r) with
// x = n ln2 + r, |r| <= ln2/2, and the Cephes expf polynomial for exp(r) (relative error
// ~1e-7). kokkos/kokkos.hpp's exp_poly applies it to one float (host and CUDA instances),
// cpu/vec_math.hpp's vexp to a vector of lanes (the attention core); the same operations in
// the same order, so every kernel and every space computes the same function. F is float or a
// GCC vector of floats; each caller clamps x, forms n and scales by 2^n its own way.
// Internal to kernels/.
#pragma once

// Plain inline: the callers decide whether inlining is forced (kokkos.hpp's exp_poly).
#if defined(__CUDACC__)
#define TESSERA_EXP_INLINE __host__ __device__ inline
#else
#define TESSERA_EXP_INLINE inline
#endif

namespace tessera::kernels::exp_parts {

// x is clamped to [kLow, kHigh]: below kLow the true value is subnormal, above kHigh it
// overflows.
inline constexpr float kLow = -87.3f, kHigh = 88.0f;
// n = round(x / ln2), computed as trunc(x log2(e) + 128.5) - 128 (the +128 keeps the truncated
// value positive).
inline constexpr float kLog2e = 1.44269504f, kRoundShift = 128.5f;
inline constexpr int kShift = 128;

// r = x - n ln2, with ln2 split in two so that n * ln2_hi is exact; fn is n as F.
template <class F>
TESSERA_EXP_INLINE F reduced(F x, F fn) {
  return (x - fn * 0.693359375f) + fn * 2.12194440e-4f;
}

// exp(r) for |r| <= ln2/2; p0 is the first coefficient, 1.9875691500e-4, as F.
template <class F>
TESSERA_EXP_INLINE F exp_reduced(F r, F p0) {
  F p = p0;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.0f;
}
inline constexpr float kP0 = 1.9875691500e-4f;

}  // namespace tessera::kernels::exp_parts
