// bf16 tile products for the CPU attention (internal to the cpu backend). Operands are held as
// pairs of bf16 values in one uint32 (the element of even index in the low half), the layout
// of the AVX512-BF16 dot-product instruction: a product C = A B contracts A's pairs along a
// row with B's pairs down a column, so A holds pairs of adjacent columns, A[i][p] =
// (A[i][2p], A[i][2p+1]), and B pairs of adjacent rows, B[p][j] = (B[2p][j], B[2p+1][j]).
// Every product of two bf16 numbers is exact in fp32 and the sums are fp32: with AVX512-BF16
// (_mm512_dpbf16_ps) the pair's two products are added in the instruction, elsewhere they are
// widened and multiplied in fp32 (the same products; the sums may round in another order,
// and the instruction flushes fp32 subnormals to zero).
#pragma once

#include <algorithm>
#include <cstdint>

#include "tensor/half.hpp"

#if defined(__AVX512BF16__) || (defined(__AMX_TILE__) && defined(__AMX_BF16__))
#include <immintrin.h>
#endif
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define TESSERA_AMX 1
#include <sys/syscall.h>
#include <unistd.h>

#include "kernels/backend.hpp"
#endif

namespace tessera::kernels::cpu::bf16_tiles {

// Register block of pair_gemm: kRows rows x kCols columns (with AVX512-BF16 one vector of
// fp32 accumulators per row), two such column blocks at once where n allows.
#if defined(__AVX512BF16__)
constexpr int64_t kRows = 8, kCols = 16;
#else
constexpr int64_t kRows = 4, kCols = 8;
#endif

// Round to nearest even on the bits, without the NaN case of half::to_bf16 (so that loops over
// it vectorise): a NaN input may come out as infinity, which is as non-finite. Attention's
// operands are finite in any step that is kept.
inline uint32_t bf16_bits(float x) {
  const uint32_t u = half::bits(x);
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
// An element's bf16 bits: an fp32 value rounded, a bf16 value (its bit pattern) as it is.
inline uint32_t bits16(float x) {
  return bf16_bits(x);
}
inline uint32_t bits16(uint16_t x) {
  return x;
}
template <class T>
inline uint32_t pack(T lo, T hi) {
  return bits16(lo) | bits16(hi) << 16;
}
inline float low(uint32_t p) {
  return half::from_bits(p << 16);
}
inline float high(uint32_t p) {
  return half::from_bits(p & 0xffff0000u);
}

// The pairs of adjacent columns of rows of a matrix x of fp32 values (rounded to bf16) or of
// bf16 values (bit patterns): dst[r * rs + p * ps] = pack(x[r][2p], x[r][2p + 1]) with
// x[r][c] = src[r * ld + c] for r < n, c < cols, and zero up to padded_n rows and `pairs`
// pairs. With rs = pairs, ps = 1 the result is an A operand over x's columns; with rs = 1 and
// ps = its row stride, the B operand x^T.
template <class T>
inline void column_pairs(const T* src, int64_t ld, int64_t n, int64_t padded_n, int64_t cols,
                         int64_t pairs, uint32_t* dst, int64_t rs, int64_t ps) {
  const int64_t whole = std::min(pairs, cols / 2);  // pairs inside x
  for (int64_t r = 0; r < padded_n; ++r) {
    uint32_t* out = dst + r * rs;
    if (r >= n) {
      for (int64_t p = 0; p < pairs; ++p) out[p * ps] = 0;
      continue;
    }
    const T* row = src + r * ld;
#pragma omp simd
    for (int64_t p = 0; p < whole; ++p) out[p * ps] = pack(row[2 * p], row[2 * p + 1]);
    for (int64_t p = whole; p < pairs; ++p) {
      const int64_t c = 2 * p;
      const uint32_t lo = c < cols ? bits16(row[c]) : 0u, hi = c + 1 < cols ? bits16(row[c + 1]) : 0u;
      out[p * ps] = lo | hi << 16;
    }
  }
}

// The pairs of adjacent rows of x (as in column_pairs): dst[p * ps + c * cs] = pack(x[2p][c],
// x[2p + 1][c]) for p < padded_n / 2 (padded_n even) and c < padded_cols, zero outside x. With
// ps = its row stride, cs = 1 the result is a B operand over x's rows; with ps = 1 and
// cs = padded_n / 2, the A operand x^T.
template <class T>
inline void row_pairs(const T* src, int64_t ld, int64_t n, int64_t padded_n, int64_t cols,
                      int64_t padded_cols, uint32_t* dst, int64_t ps, int64_t cs) {
  for (int64_t p = 0; p < padded_n / 2; ++p) {
    const int64_t r = 2 * p;
    uint32_t* out = dst + p * ps;
    if (r + 1 < n) {  // both rows inside x
      const T *lo = src + r * ld, *hi = lo + ld;
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) out[c * cs] = pack(lo[c], hi[c]);
    } else {
      for (int64_t c = 0; c < cols; ++c) out[c * cs] = r < n ? bits16(src[r * ld + c]) : 0u;
    }
    for (int64_t c = cols; c < padded_cols; ++c) out[c * cs] = 0;
  }
}

#if defined(__AVX512BF16__)
// C[i][0, 16 NV) (+)= sum_p A[i][p] . B[p][0, 16 NV) for kRows rows.
template <int NV, bool Accumulate>
inline void pair_block(int64_t kp, const uint32_t* A, int64_t lda, const uint32_t* B, int64_t ldb,
                       float* C, int64_t ldc) {
  __m512 acc[kRows][NV];
  for (int64_t i = 0; i < kRows; ++i)
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp; ++p) {
    __m512bh b[NV];
    for (int v = 0; v < NV; ++v)
      b[v] = (__m512bh)_mm512_loadu_si512(static_cast<const void*>(B + p * ldb + kCols * v));
#pragma GCC unroll 8
    for (int64_t i = 0; i < kRows; ++i) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(int32_t(A[i * lda + p]));
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], a, b[v]);
    }
  }
  for (int64_t i = 0; i < kRows; ++i)
    for (int v = 0; v < NV; ++v) {
      float* c = C + i * ldc + kCols * v;
      _mm512_storeu_ps(c, Accumulate ? _mm512_add_ps(_mm512_loadu_ps(c), acc[i][v]) : acc[i][v]);
    }
}
#else
template <int NV, bool Accumulate>
inline void pair_block(int64_t kp, const uint32_t* A, int64_t lda, const uint32_t* B, int64_t ldb,
                       float* C, int64_t ldc) {
  constexpr int64_t n = kCols * NV;
  float acc[kRows][n] = {};
  for (int64_t p = 0; p < kp; ++p) {
    const uint32_t* b = B + p * ldb;
    for (int64_t i = 0; i < kRows; ++i) {
      const float a0 = low(A[i * lda + p]), a1 = high(A[i * lda + p]);
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) acc[i][j] += a0 * low(b[j]) + a1 * high(b[j]);
    }
  }
  for (int64_t i = 0; i < kRows; ++i) {
    float* c = C + i * ldc;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) c[j] = Accumulate ? c[j] + acc[i][j] : acc[i][j];
  }
}
#endif

#if defined(TESSERA_AMX)
// The same products on the matrix engine (AMX): the pair layouts above are AMX's own, an A tile
// being 16 rows of 16 pairs and a B tile 16 rows of pairs of 16 columns, so tiles load straight
// from the operands. Every one of the 8 tile registers is 16 rows x 64 bytes: C in 0-3 (a 2 x 2
// block of 16 x 16 fp32), A in 4-5, B in 6-7. Used for blocks whose m, n and kp are multiples of
// 16 (every whole 64 x 64 tile with D a multiple of 32), and only where oneDNN itself uses AMX
// (so ONEDNN_MAX_CPU_ISA caps both) and Linux grants the tile state. The products are the same
// exact ones, the sums fp32 in the engine's order: bits may differ from the vector unit's.
namespace amx {

// Once per process: the kernel's permission to use the AMX tile data (ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA); oneDNN asks for it too when its GEMMs use AMX.
inline bool usable() {
  static const bool ok = cpu::gemm_matrix_engine() && syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return ok;
}

// The tile configuration (palette 1), loaded by each call: it is per thread, and oneDNN's
// kernels load their own.
inline void configure() {
  struct alignas(64) Config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
  } cfg{};
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  _tile_loadconfig(&cfg);
}

// C (+)= A B as pair_gemm, m, n and kp multiples of 16. A C block is summed from zero and, with
// Accumulate, added to C afterwards (as the vector path adds its accumulators).
template <bool Accumulate>
void gemm(int64_t m, int64_t n, int64_t kp, const uint32_t* A, int64_t lda, const uint32_t* B,
          int64_t ldb, float* C, int64_t ldc) {
  configure();
  alignas(64) float part[16 * 16];
  const auto store = [&](auto tile, int64_t i, int64_t j) {
    float* c = C + i * ldc + j;
    if constexpr (!Accumulate) {
      tile(c, ldc * 4);
    } else {
      tile(part, 64);
      for (int64_t r = 0; r < 16; ++r)
        _mm512_storeu_ps(c + r * ldc,
                         _mm512_add_ps(_mm512_loadu_ps(c + r * ldc), _mm512_load_ps(part + 16 * r)));
    }
  };
  for (int64_t i = 0; i < m; i += 32) {
    const bool two_i = i + 32 <= m;
    for (int64_t j = 0; j < n; j += 32) {
      const bool two_j = j + 32 <= n;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t p = 0; p < kp; p += 16) {
        _tile_loadd(4, A + i * lda + p, lda * 4);
        _tile_loadd(6, B + p * ldb + j, ldb * 4);
        _tile_dpbf16ps(0, 4, 6);
        if (two_j) {
          _tile_loadd(7, B + p * ldb + j + 16, ldb * 4);
          _tile_dpbf16ps(1, 4, 7);
        }
        if (two_i) {
          _tile_loadd(5, A + (i + 16) * lda + p, lda * 4);
          _tile_dpbf16ps(2, 5, 6);
          if (two_j) _tile_dpbf16ps(3, 5, 7);
        }
      }
      store([](void* c, int64_t s) { _tile_stored(0, c, s); }, i, j);
      if (two_j) store([](void* c, int64_t s) { _tile_stored(1, c, s); }, i, j + 16);
      if (two_i) store([](void* c, int64_t s) { _tile_stored(2, c, s); }, i + 16, j);
      if (two_i && two_j) store([](void* c, int64_t s) { _tile_stored(3, c, s); }, i + 16, j + 16);
    }
  }
}

}  // namespace amx
#endif

// C[m,n] = (or +=) A B over kp pairs: A[i][p] at A[i * lda + p], B[p][j] at B[p * ldb + j],
// C row-major fp32. Requires m % kRows == 0 and n % kCols == 0.
template <bool Accumulate>
void pair_gemm(int64_t m, int64_t n, int64_t kp, const uint32_t* A, int64_t lda, const uint32_t* B,
               int64_t ldb, float* C, int64_t ldc) {
#if defined(TESSERA_AMX)
  if (m % 16 == 0 && n % 16 == 0 && kp % 16 == 0 && amx::usable())
    return amx::gemm<Accumulate>(m, n, kp, A, lda, B, ldb, C, ldc);
#endif
  for (int64_t i = 0; i < m; i += kRows) {
    int64_t j = 0;
    for (; j + 2 * kCols <= n; j += 2 * kCols)
      pair_block<2, Accumulate>(kp, A + i * lda, lda, B + j, ldb, C + i * ldc + j, ldc);
    if (j < n) pair_block<1, Accumulate>(kp, A + i * lda, lda, B + j, ldb, C + i * ldc + j, ldc);
  }
}

}  // namespace tessera::kernels::cpu::bf16_tiles
