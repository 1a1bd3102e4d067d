// Internal to kernels/: what the Kokkos kernels of this folder share. Each kernel is written
// once, as a function template over the Kokkos execution space, and each family's register_*
// fills a Backend table with the instances of one Target: the host space (OpenMP) for the cpu
// table, the CUDA space (on the calling thread's cuda::Context stream) for the cuda table.
//
// Conventions that keep results deterministic and equal in both spaces:
//  * no floating-point atomics; a sum over rows is a loop inside one thread or one team, in
//    row order, and sums of many terms are accumulated in double;
//  * per-column sums (bias, norm weights, embedding rows) are parallel over columns, each
//    column summed over the rows in order, so the result does not depend on the thread count;
//  * exp goes through exp_poly (the Cephes polynomial of kernels/exp_poly.hpp, which the CPU
//    attention core's vector exp uses too), so a host and a device run compute the same
//    function.
//
// This header is compiled by the host compiler in a CPU build and by nvcc (as CUDA) in a CUDA
// build; nothing outside this folder includes it or Kokkos.
//
// A kernel body is written TESSERA_LAMBDA(E, (args) { body }), never KOKKOS_LAMBDA. In a CUDA
// build KOKKOS_LAMBDA is an extended __host__ __device__ lambda, and nvcc replaces every one,
// in host code, by a type-erased wrapper called through a function pointer: the host instances
// then ran one indirect call per element, neither inlined nor vectorised (1.06-1.7x slower
// than a CPU build, doc/performance.md). TESSERA_LAMBDA is a plain lambda in the host
// instance and an extended one in the CUDA instance only, the body written once.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <type_traits>

#include "kernels/backend.hpp"
#include "kernels/exp_poly.hpp"
#include "tensor/half.hpp"

namespace tessera::kernels::kokkos {

using Host = Kokkos::DefaultHostExecutionSpace;
#ifdef KOKKOS_ENABLE_CUDA
using Device = Kokkos::Cuda;
#endif

// The closure of a kernel body for space Exec (a template parameter of the enclosing function):
// for the CUDA space an extended lambda, which device code needs; for the host space a plain
// one, which the host compiler inlines into Kokkos' loops. Only the branch of Exec is
// instantiated, so the host instances hold no extended lambda at all. The immediately called
// [&] lambda is where the two closure types part; nvcc allows an extended lambda in it (its
// enclosing function is then the kernel's). A host-only build has one kind of lambda.
#ifdef KOKKOS_ENABLE_CUDA
#define TESSERA_LAMBDA(Exec, ...)                                                     \
  [&] {                                                                               \
    if constexpr (std::is_same_v<Exec, ::tessera::kernels::kokkos::Device>) {         \
      return KOKKOS_LAMBDA __VA_ARGS__;                                               \
    } else {                                                                          \
      return [=] __VA_ARGS__;                                                         \
    }                                                                                 \
  }()
#else
#define TESSERA_LAMBDA(Exec, ...) [=] __VA_ARGS__
#endif

// Initialises Kokkos once per process (threads: OpenMP's current maximum, so a run's
// hardware.threads applies), and finalises it at exit.
void ensure_initialized();

// The execution space instance a kernel runs on: the host space, or the CUDA space bound to the
// stream of the calling thread's cuda::Context.
template <class Exec>
Exec instance();
template <>
inline Host instance<Host>() {
  return Host();
}
#ifdef KOKKOS_ENABLE_CUDA
template <>
Device instance<Device>();
#endif

template <class Exec>
using Range = Kokkos::RangePolicy<Exec, Kokkos::IndexType<int64_t>>;
template <class Exec>
using Teams = Kokkos::TeamPolicy<Exec, Kokkos::IndexType<int64_t>>;
template <class Exec>
using Team = typename Teams<Exec>::member_type;

template <class Exec>
Range<Exec> range(int64_t n) {
  return Range<Exec>(instance<Exec>(), 0, n);
}
// One team per row; AUTO picks the team size of the space (1 thread on the host).
template <class Exec>
Teams<Exec> rows(int64_t n) {
  return Teams<Exec>(instance<Exec>(), n, Kokkos::AUTO);
}

// How work is cut into per-thread pieces, by space. On the host a piece is wide, so that a
// thread's loops are long, contiguous and vectorised (constant-length inner loops of `lanes`
// elements, sums keeping one partial per lane); on a GPU a piece is one element, so that
// neighbouring threads read neighbouring addresses.
//   lanes:          the vector width of host inner loops
//   sum_block:      elements of a flat reduction one thread sums before combining
//   column_block:   columns one thread sums over every row (bias, norm weights, embedding)
template <class Exec>
inline constexpr int64_t lanes = 16;
template <class Exec>
inline constexpr int64_t sum_block = 256;
template <class Exec>
inline constexpr int64_t column_block = 128;
#ifdef KOKKOS_ENABLE_CUDA
template <>
inline constexpr int64_t lanes<Device> = 1;
template <>
inline constexpr int64_t sum_block<Device> = 1;
template <>
inline constexpr int64_t column_block<Device> = 1;
#endif

template <class Exec>
KOKKOS_INLINE_FUNCTION int64_t blocks(int64_t n) {
  return (n + sum_block<Exec> - 1) / sum_block<Exec>;
}
template <class Exec>
KOKKOS_INLINE_FUNCTION int64_t column_blocks(int64_t C) {
  return (C + column_block<Exec> - 1) / column_block<Exec>;
}

// f(k) for k < w; w == W takes a loop of constant length, which the host compiler vectorises.
template <int64_t W, class F>
KOKKOS_INLINE_FUNCTION void for_lanes(int64_t w, const F& f) {
  if (w == W) {
    for (int64_t k = 0; k < W; ++k) f(k);
  } else {
    for (int64_t k = 0; k < w; ++k) f(k);
  }
}

// Writers of a float result x at index i of y: as it is, rounded to bf16 or fp16 (as
// kernels::cast rounds), or nowhere.
struct StoreF32 {
  float* y;
  KOKKOS_INLINE_FUNCTION void operator()(int64_t i, float x) const { y[i] = x; }
};
struct StoreBf16 {
  uint16_t* y;
  KOKKOS_INLINE_FUNCTION void operator()(int64_t i, float x) const { y[i] = half::to_bf16(x); }
};
struct StoreF16 {
  uint16_t* y;
  KOKKOS_INLINE_FUNCTION void operator()(int64_t i, float x) const { y[i] = half::to_f16(x); }
};
struct StoreNone {
  KOKKOS_INLINE_FUNCTION void operator()(int64_t, float) const {}
};

// f(i) for every i < n, one element at a time on a GPU. On the host each thread takes pieces of
// `piece` contiguous elements and runs them from a local copy of f: stores through the kernel's
// float pointers then cannot alias the floats f captured, so they stay in registers and the loop
// vectorises (a loop over Kokkos' functor reloads them after every store, and runs scalar).
// f must be elementwise: element i reads and writes only index i of arrays that are either the
// same or do not overlap.
template <class Exec, class F>
void for_each(const char* name, int64_t n, const F& f) {
  if constexpr (lanes<Exec> == 1) {
    Kokkos::parallel_for(name, range<Exec>(n), f);
  } else {
    constexpr int64_t piece = 4096;
    Kokkos::parallel_for(name, range<Exec>((n + piece - 1) / piece), [=](int64_t p) {
      const F g = f;
      const int64_t i0 = p * piece, i1 = n - i0 < piece ? n : i0 + piece;
#pragma GCC ivdep
      for (int64_t i = i0; i < i1; ++i) g(i);
    });
  }
}

// Sum in double of term(i) over block blk of [0, n) (blocks of sum_block elements), one
// partial per lane, added in a fixed order.
template <class Exec, class Term>
KOKKOS_INLINE_FUNCTION double block_sum(int64_t blk, int64_t n, const Term& term) {
  constexpr int64_t L = lanes<Exec>, B = sum_block<Exec>;
  const int64_t i0 = blk * B, m = n - i0 < B ? n - i0 : B;
  const int64_t full = m / L * L;
  double part[L] = {};
  for (int64_t i = 0; i < full; i += L)
    for (int64_t k = 0; k < L; ++k) part[k] += term(i0 + i + k);
  for (int64_t k = 0; k < m - full; ++k) part[k] += term(i0 + full + k);
  double s = 0;
  for (int64_t k = 0; k < L; ++k) s += part[k];
  return s;
}

// Sum over i < n of term(i) in double by one team (a row kernel's statistic).
template <class Exec, class Term>
KOKKOS_INLINE_FUNCTION double team_sum(const Team<Exec>& team, int64_t n, const Term& term) {
  double total = 0;
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(team, blocks<Exec>(n)),
      [&](int64_t blk, double& acc) { acc += block_sum<Exec>(blk, n, term); }, total);
  return total;
}

// A double in the space's memory for one kernel's partial result, reused by the next kernel
// queued in the same order (the host: a thread's own; CUDA: the context's scratch).
template <class Exec>
double* scratch_scalar();
template <>
inline double* scratch_scalar<Host>() {
  static thread_local double x;
  return &x;
}
#ifdef KOKKOS_ENABLE_CUDA
template <>
double* scratch_scalar<Device>();
#endif

// exp(x) with relative error ~1e-7, 0 below -87.3 (where the true value is subnormal), x
// clamped at 88. Branch-free, so host loops over it vectorise, once it is inlined. A CUDA build
// compiles the kernels as one translation unit, where GCC reaches its unit growth limit and left
// the fp32 cross-entropy's gradient loop calling it (2.6x slower): forced there. Not in a
// host-only build, which inlines it anyway: forcing it moved GCC's other inlining decisions
// (the epilogues' sigmoid), and with them FMA contractions, so 16-bit runs changed bits.
#ifdef KOKKOS_ENABLE_CUDA
KOKKOS_FORCEINLINE_FUNCTION
#else
KOKKOS_INLINE_FUNCTION
#endif
float exp_poly(float x) {
  namespace e = exp_parts;  // kernels/exp_poly.hpp: the polynomial the CPU kernels use too
  const bool tiny = x < e::kLow;
  x = x < e::kLow ? e::kLow : x;
  x = x > e::kHigh ? e::kHigh : x;
  const int32_t n = int32_t(x * e::kLog2e + e::kRoundShift) - e::kShift;
  const float fn = float(n);
  const float p = e::exp_reduced(e::reduced(x, fn), e::kP0);
  const float scale = Kokkos::bit_cast<float>((n + 127) << 23);
  return tiny ? 0.0f : p * scale;
}

// s = sigmoid(x) and c = 1 - s = sigmoid(-x), both to fp32 relative accuracy over the whole
// range: with e = exp(-|x|), sigmoid(|x|) = 1 / (1 + e) and sigmoid(-|x|) = e / (1 + e).
struct Sigmoid {
  float s, c;
};
KOKKOS_INLINE_FUNCTION Sigmoid sigmoid(float x) {
  const float e = exp_poly(x < 0.0f ? x : -x);
  const float big = 1.0f / (1.0f + e);
  const float small = e * big;
  return x < 0.0f ? Sigmoid{small, big} : Sigmoid{big, small};
}

// The families, one per file of this folder (register_all, runtime.cpp, calls them all).
void register_elementwise(Backend& b, Target t);
void register_cast(Backend& b, Target t);
void register_norm(Backend& b, Target t);
void register_activation(Backend& b, Target t);
void register_epilogue(Backend& b, Target t);
void register_rope(Backend& b, Target t);
void register_embedding(Backend& b, Target t);
void register_cross_entropy(Backend& b, Target t);
void register_adamw(Backend& b, Target t);
void register_routing(Backend& b, Target t);

// Fills the entries of one family for Target t from the template F<Exec>, which has a static
// fill(Backend&): F<Host> for Target::host, F<Device> for Target::cuda.
template <template <class> class F>
void register_for(Backend& b, Target t) {
  if (t == Target::host) return F<Host>::fill(b);
#ifdef KOKKOS_ENABLE_CUDA
  F<Device>::fill(b);
#endif
}

}  // namespace tessera::kernels::kokkos
