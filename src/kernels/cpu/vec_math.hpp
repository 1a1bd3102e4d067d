// Vector math shared by the CPU kernels (internal to the cpu backend): fixed-width float
// vectors (GCC/Clang vector extension), a polynomial exp and the sigmoid built on it, and
// loops that apply them over arrays. GCC does not vectorise calls to libm's expf/tanhf
// without -ffast-math, so loops that need exponentials are written with these instead.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>

#include "kernels/exp_poly.hpp"

namespace tessera::kernels::vec {

// Float/int vectors of the target's width.
#if defined(__AVX__)
constexpr int64_t kLanes = 8;
#else
constexpr int64_t kLanes = 4;
#endif
using vfloat = float __attribute__((vector_size(4 * kLanes)));
using vint = int32_t __attribute__((vector_size(4 * kLanes)));
using vdouble = double __attribute__((vector_size(8 * kLanes)));

inline vfloat vload(const float* p) {
  vfloat v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void vstore(float* p, vfloat v) {
  std::memcpy(p, &v, sizeof v);
}
inline vfloat vsplat(float x) {
  return vfloat{} + x;
}
// mask ? a : b per lane; mask lanes are 0 or -1 (what vector comparisons return).
inline vfloat vselect(vint mask, vfloat a, vfloat b) {
  return std::bit_cast<vfloat>((mask & std::bit_cast<vint>(a)) | (~mask & std::bit_cast<vint>(b)));
}
inline vfloat vabs(vfloat x) {
  return std::bit_cast<vfloat>(std::bit_cast<vint>(x) & 0x7fffffff);
}
// Lanes c0 .. c0 + kLanes - 1 that are < n.
inline vint lanes_below(int64_t c0, int64_t n) {
  vint lane;
  for (int32_t i = 0; i < kLanes; ++i) lane[i] = i;
  return lane < (vint{} + static_cast<int32_t>(n - c0));
}
inline float hsum(vfloat v) {
  float s = 0.0f;
  for (int64_t i = 0; i < kLanes; ++i) s += v[i];
  return s;
}
inline double hsum(const vdouble& v) {  // by reference: vdouble may be wider than the ABI's vectors
  double s = 0.0;
  for (int64_t i = 0; i < kLanes; ++i) s += v[i];
  return s;
}
inline float hmax(vfloat v) {
  float m = v[0];
  for (int64_t i = 1; i < kLanes; ++i) m = std::max(m, v[i]);
  return m;
}

// exp(x) per lane with relative error ~1e-7; x is clamped to [-87.3, 88], so exp of a very
// negative x is ~1e-38 rather than 0 (callers zero masked lanes themselves).
inline vfloat vexp(vfloat x) {
  namespace e = exp_parts;  // kernels/exp_poly.hpp: the polynomial the Kokkos kernels use too
  x = vselect(x < vsplat(e::kLow), vsplat(e::kLow), x);
  x = vselect(x > vsplat(e::kHigh), vsplat(e::kHigh), x);
  const vint n = __builtin_convertvector(x * e::kLog2e + e::kRoundShift, vint) - e::kShift;
  const vfloat fn = __builtin_convertvector(n, vfloat);
  const vfloat p = e::exp_reduced(e::reduced(x, fn), vsplat(e::kP0));
  return p * std::bit_cast<vfloat>((n + 127) << 23);
}

// exp(x) as vexp, but 0 where x < -87.3 (there the true value is subnormal or 0, and vexp
// returns its clamp value ~1e-38).
inline vfloat vexp_flush(vfloat x) {
  return vselect(x < vsplat(-87.3f), vfloat{}, vexp(x));
}

// s = sigmoid(x) = 1 / (1 + exp(-x)) and its complement c = 1 - s = sigmoid(-x), both with
// fp32 relative accuracy over the whole range: with e = exp(-|x|) in [0, 1],
// sigmoid(|x|) = 1 / (1 + e) and sigmoid(-|x|) = e / (1 + e). Nothing overflows, and the
// small one of s and c is never formed as 1 minus something close to 1.
struct Sigmoid {
  vfloat s, c;
};
inline Sigmoid vsigmoid(vfloat x) {
  const vfloat e = vexp_flush(-vabs(x));
  const vfloat big = 1.0f / (1.0f + e);  // sigmoid(|x|)
  const vfloat small = e * big;          // sigmoid(-|x|)
  const vint neg = x < 0.0f;
  return {vselect(neg, small, big), vselect(neg, big, small)};
}

// Elements [i, i + n) of the arrays an elementwise loop walks; n == kLanes except in the
// last block, whose loads fill the missing lanes with 0 and whose stores skip them.
struct Block {
  int64_t i, n;
  vfloat load(const float* p) const {
    if (n == kLanes) return vload(p + i);
    vfloat v = {};
    std::memcpy(&v, p + i, sizeof(float) * n);
    return v;
  }
  void store(float* p, vfloat v) const {
    if (n == kLanes) return vstore(p + i, v);
    std::memcpy(p + i, &v, sizeof(float) * n);
  }
};

// f(Block) for the blocks covering [0, n), split over the OpenMP threads.
template <class F>
void for_each_block(int64_t n, F&& f) {
  const int64_t full = n / kLanes;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < full; ++b) f(Block{b * kLanes, kLanes});
  if (n % kLanes != 0) f(Block{full * kLanes, n % kLanes});
}

// max(x[0], ..., x[n-1]) for n >= 1, ignoring NaNs after x[0] as the plain loop
// `m = x[i] > m ? x[i] : m` does.
inline float max_of(const float* x, int64_t n) {
  vfloat m = vsplat(x[0]);
  const Block tail{n - n % kLanes, n % kLanes};
  for (int64_t i = 0; i < tail.i; i += kLanes) {
    const vfloat v = vload(x + i);
    m = vselect(v > m, v, m);
  }
  if (tail.n != 0) {
    const vfloat v = tail.load(x);
    m = vselect(lanes_below(0, tail.n) & (v > m), v, m);
  }
  return hmax(m);
}

// y[i] = exp(x[i] - shift) for i < n (y may be x, not otherwise overlapping it); returns
// the sum of the y[i], accumulated in double. Terms below exp(-87.3) ~ 1e-38 are 0.
inline double exp_shifted_sum(const float* x, float shift, float* y, int64_t n) {
  vdouble sum = {};
  const Block tail{n - n % kLanes, n % kLanes};
  for (int64_t i = 0; i < tail.i; i += kLanes) {
    const vfloat e = vexp_flush(vload(x + i) - shift);
    vstore(y + i, e);
    sum += __builtin_convertvector(e, vdouble);
  }
  if (tail.n != 0) {
    const vfloat e = vselect(lanes_below(0, tail.n), vexp_flush(tail.load(x) - shift), vfloat{});
    tail.store(y, e);
    sum += __builtin_convertvector(e, vdouble);
  }
  return hsum(sum);
}

}  // namespace tessera::kernels::vec
