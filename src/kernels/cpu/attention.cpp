// CPU causal attention, flash-attention style. For query row i of head h (kv head g):
//   s_ij = scale * q_i . k_j (k_pos0 + j <= q_pos0 + i),  lse_i = log sum_j exp(s_ij),
//   out_i = sum_j exp(s_ij - lse_i) v_j.
// The forward walks 64x64 query/key tiles with an online softmax and saves only out and lse.
// The backward recomputes each probability tile P = exp(S - lse) and applies
//   dV += P^T dO,  dS = P * (dO V^T - rowsum(dO * out)),  dQ += scale dS K,  dK += scale dS^T Q.
// Both passes compute S as (scale Q) K^T (bf16: scale (Q K^T)) with the same code, so the
// backward recomputes exactly the scores that the forward's lse normalised.
// Tiles are copied into zero-padded thread-local buffers so that every product is a small
// dense GEMM over whole register blocks.
//
// Document masking (doc_start given, kernels.hpp): query row i also needs
// k_pos0 + j >= doc_start[b, i], so its visible keys are the local range [first_i, last_i];
// a key tile below every row's first key of a query tile is skipped like a future one.
//
// With AttnShape::compute = bf16 the copies take q, k, v as stored in bf16, or round fp32 ones
// (the same bits), and round dout, into pair layouts (bf16_tiles.hpp); the seven tile products
// multiply bf16 operands with fp32 sums. The scale multiplies the fp32 scores
// (S = scale (Q K^T), dK = scale dS^T Q) instead of the query copy, as flash-attention does, so
// that a bf16 q is read as it is kept. The probabilities P and dS are rounded to bf16 just
// before the products that read them (P V, P^T dO, dS K, dS^T Q), as flash-attention does on
// tensor cores. The scores, the online softmax, lse, Dvec (from bf16 dout and the output as
// stored) and every accumulator stay fp32; the output is written in fp32 or rounded once to
// bf16 (a bf16 run's kept output). The
// forward rounds its unnormalised P = exp(s - m), m the running maximum over the key tiles seen
// so far, and sums the row from the rounded values, so that out = sum P v / sum P is a convex
// combination of the bf16 v rows (with the fp32 sum instead, reference_llama_bf16's 50-step
// loss trajectory drifted 2.5e-2 from float64, against 1.2e-2 this way and 0.9e-2 for autocast).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/backend.hpp"
#include "kernels/cpu/bf16_tiles.hpp"
#include "kernels/cpu/vec_math.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace tessera::kernels::cpu {
namespace {

constexpr int64_t kTile = 64;  // query and key tile length
// Register block of the tile GEMMs (kMR rows x kNR columns of accumulators), sized to the
// vector register file; kTile must be a multiple of both.
#if defined(__AVX512F__)
constexpr int64_t kMR = 8, kNR = 16;
#elif defined(__AVX__)
constexpr int64_t kMR = 4, kNR = 16;
#else
constexpr int64_t kMR = 4, kNR = 8;
#endif
static_assert(kTile % kNR == 0 && kNR % kMR == 0);
// The bf16 products run over the same padded tiles.
using bf16_tiles::column_pairs;
using bf16_tiles::pair_gemm;
using bf16_tiles::row_pairs;
static_assert(kMR % bf16_tiles::kRows == 0 && kNR % bf16_tiles::kCols == 0);

// Vector helpers (vec_math.hpp). The softmax exponentials use them because GCC does not
// vectorise a clamped exp written as a plain loop.
using vec::hmax;
using vec::hsum;
using vec::kLanes;
using vec::lanes_below;
using vec::vexp;
using vec::vfloat;
using vec::vint;
using vec::vload;
using vec::vselect;
using vec::vsplat;
using vec::vstore;
static_assert(kNR % kLanes == 0);

// x rounded to bf16 (to nearest even) and widened back, per lane; x is finite here.
inline vfloat round_bf16(vfloat x) {
  const vint u = std::bit_cast<vint>(x);
  return std::bit_cast<vfloat>((u + 0x7fff + ((u >> 16) & 1)) & int32_t(0xffff0000u));
}

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}
int64_t num_tiles(int64_t T) {
  return (T + kTile - 1) / kTile;
}

// Index helpers for the [B,T,Hq,D] queries, [B,Tk,Hkv,D] keys and the [B,Hq,T] row statistics.
// Dp is D padded to the register block width: the row stride of the local tile buffers.
// shift = q_pos0 - k_pos0: query row i sees key row j when j <= i + shift, and, with document
// starts, when j >= first_key(b, i).
struct Geometry {
  int64_t T, Tk, Hq, Hkv, D, Dp, group, shift, k_pos0;
  const int32_t* doc;  // [B, T] global position of each query row's document start, or null
  Geometry(const AttnShape& s, const int32_t* doc_start)
      : T(s.T),
        Tk(s.keys()),
        Hq(s.Hq),
        Hkv(s.Hkv),
        D(s.D),
        Dp(round_up(s.D, kNR)),
        group(s.Hq / s.Hkv),
        shift(s.q_pos0 - s.k_pos0),
        k_pos0(s.k_pos0),
        doc(doc_start) {}
  int64_t q_at(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * Hq + h) * D; }
  int64_t kv_at(int64_t b, int64_t t, int64_t g) const { return ((b * Tk + t) * Hkv + g) * D; }
  int64_t stat_at(int64_t b, int64_t h, int64_t t) const { return (b * Hq + h) * T + t; }
  // The first key row query row i of sequence b may see (0 without document starts).
  int64_t first_key(int64_t b, int64_t i) const {
    return doc ? std::max<int64_t>(0, doc[b * T + i] - k_pos0) : 0;
  }
};

// Rows and padded rows of tile `ib` of a length-T sequence.
struct TileRange {
  int64_t start, n, n_rows, n_cols;  // n_rows: n rounded to kMR, n_cols: n rounded to kNR
  TileRange(int64_t T, int64_t ib)
      : start(ib * kTile),
        n(std::min(kTile, T - ib * kTile)),
        n_rows(round_up(n, kMR)),
        n_cols(round_up(n, kNR)) {}
};

// Number of keys of the tile starting at key row j0 (nk keys) visible to query row i, for
// shift = q_pos0 - k_pos0; 0 when the whole tile is in the query's future.
int64_t causal_count(int64_t i, int64_t j0, int64_t nk, int64_t shift) {
  return std::max<int64_t>(0, std::min(nk, i + shift - j0 + 1));
}

// The least first key of the rows of query tile Q of sequence b.
int64_t tile_first_key(const Geometry& G, int64_t b, const TileRange& Q) {
  int64_t first = G.first_key(b, Q.start);
  for (int64_t r = 1; G.doc && r < Q.n; ++r) first = std::min(first, G.first_key(b, Q.start + r));
  return first;
}

// Whether key tile K is not wholly in the future of query tile Q.
bool tiles_meet(const TileRange& Q, const TileRange& K, int64_t shift) {
  return K.start <= Q.start + Q.n - 1 + shift;
}
// Whether any query row of tile Q sees any key of tile K (causal and document masks); first:
// tile_first_key of Q.
bool tiles_meet(const TileRange& Q, const TileRange& K, int64_t shift, int64_t first) {
  return tiles_meet(Q, K, shift) && K.start + K.n > first;
}

// The lanes [c0, c0 + kLanes) of a key tile's row that query row i sees: below nc (causal) and
// from lo on (its document's first key, relative to the tile).
vint visible_lanes(int64_t c0, int64_t lo, int64_t nc) {
  return lo > 0 ? lanes_below(c0, nc) & ~lanes_below(c0, lo) : lanes_below(c0, nc);
}

// dst[r * Dp + d] = alpha * src[r * ld + d] for r < n, d < D; zero up to padded_n rows, Dp.
void load_rows(const float* src, int64_t ld, int64_t n, int64_t padded_n, int64_t D, int64_t Dp,
               float alpha, float* dst) {
  for (int64_t r = 0; r < padded_n; ++r) {
    float* out = dst + r * Dp;
    if (r < n) {
      const float* row = src + r * ld;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) out[d] = alpha * row[d];
      if (Dp > D) std::fill(out + D, out + Dp, 0.0f);
    } else {
      std::fill(out, out + Dp, 0.0f);
    }
  }
}

// dst[d * kTile + c] = src[c * ld + d] for c < n, d < D; zero for c < padded_n, d < Dp.
void load_transposed(const float* src, int64_t ld, int64_t n, int64_t padded_n, int64_t D,
                     int64_t Dp, float* dst) {
  for (int64_t d = 0; d < Dp; ++d) {
    float* out = dst + d * kTile;
    if (d < D) {
      for (int64_t c = 0; c < n; ++c) out[c] = src[c * ld + d];
      if (padded_n > n) std::fill(out + n, out + padded_n, 0.0f);
    } else {
      std::fill(out, out + padded_n, 0.0f);
    }
  }
}

// C[m,n] = (or +=) op(A)[m,k] * B[k,n], all row-major; op(A)[i][p] is A[i * lda + p], or
// A[p * lda + i] when TransA. Requires m % kMR == 0 and n % kNR == 0.
template <bool TransA, bool Accumulate>
void gemm_tile(int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B,
               int64_t ldb, float* C, int64_t ldc) {
  for (int64_t i = 0; i < m; i += kMR)
    for (int64_t j = 0; j < n; j += kNR) {
      float acc[kMR][kNR] = {};
      for (int64_t p = 0; p < k; ++p) {
        const float* b = B + p * ldb + j;
#pragma GCC unroll 8
        for (int64_t ii = 0; ii < kMR; ++ii) {
          const float a = TransA ? A[p * lda + i + ii] : A[(i + ii) * lda + p];
#pragma omp simd
          for (int64_t jj = 0; jj < kNR; ++jj) acc[ii][jj] += a * b[jj];
        }
      }
#pragma GCC unroll 8
      for (int64_t ii = 0; ii < kMR; ++ii) {
        float* c = C + (i + ii) * ldc + j;
#pragma omp simd
        for (int64_t jj = 0; jj < kNR; ++jj) c[jj] = Accumulate ? c[jj] + acc[ii][jj] : acc[ii][jj];
      }
    }
}

// ---- forward ----------------------------------------------------------------------------

// fp32: the operand tiles Qs (scale q), KT (k^T), Vs; bf16: their pairs Qp (of columns), Kd
// (k^T, pairs over d), Vr (pairs of rows) and Pp, the probabilities as pairs of columns.
template <bool Bf16>
struct ForwardScratch {
  std::vector<float> Qs, KT, Vs, S, O, m, l;
  std::vector<uint32_t> Qp, Kd, Vr, Pp;
  explicit ForwardScratch(int64_t Dp)
      : Qs(Bf16 ? 0 : kTile * Dp),
        KT(Bf16 ? 0 : Dp * kTile),
        Vs(Bf16 ? 0 : kTile * Dp),
        S(kTile * kTile),
        O(kTile * Dp),
        m(kTile),
        l(kTile),
        Qp(Bf16 ? kTile * Dp / 2 : 0),
        Kd(Bf16 ? Dp / 2 * kTile : 0),
        Vr(Bf16 ? kTile / 2 * Dp : 0),
        Pp(Bf16 ? kTile * kTile / 2 : 0) {}
};

// One query tile of one (b, h): its out rows (out, or out16 in bf16 when given) and lse.
// In: the element type of q, k, v (float; in bf16, float or uint16_t, bf16 bit patterns).
template <bool Bf16, class In>
void forward_tile(const In* q, const In* k, const In* v, float* out, uint16_t* out16, float* lse,
                  const Geometry& G, float scale, int64_t b, int64_t h, int64_t ib,
                  ForwardScratch<Bf16>& ws) {
  const int64_t D = G.D, Dp = G.Dp, g = h / G.group, ld = G.Hkv * D;
  const TileRange Q(G.T, ib);
  // fp32: the scale is folded into the query copy; bf16: q is read as it is stored and the
  // scores are scaled in fp32 (sscale), as flash-attention does.
  const float sscale = Bf16 ? scale : 1.0f;
  if constexpr (Bf16)
    column_pairs(q + G.q_at(b, Q.start, h), G.Hq * D, Q.n, Q.n_rows, D, Dp / 2, ws.Qp.data(),
                 Dp / 2, 1);
  else
    load_rows(q + G.q_at(b, Q.start, h), G.Hq * D, Q.n, Q.n_rows, D, Dp, scale, ws.Qs.data());
  std::fill(ws.O.begin(), ws.O.end(), 0.0f);
  std::fill(ws.l.begin(), ws.l.end(), 0.0f);
  constexpr float kNoKey = -std::numeric_limits<float>::infinity();
  std::fill(ws.m.begin(), ws.m.end(), kNoKey);  // running max; -inf: no key seen yet
  const int64_t nkt = num_tiles(G.Tk), first = tile_first_key(G, b, Q);
  // Key tiles before every row's document are skipped; later key tiles are later still.
  for (int64_t jb = std::min(nkt, first / kTile); jb < nkt; ++jb) {
    const TileRange K(G.Tk, jb);
    if (!tiles_meet(Q, K, G.shift)) break;
    if constexpr (Bf16) {
      column_pairs(k + G.kv_at(b, K.start, g), ld, K.n, K.n_cols, D, Dp / 2, ws.Kd.data(), 1,
                   kTile);
      row_pairs(v + G.kv_at(b, K.start, g), ld, K.n, K.n_cols, D, Dp, ws.Vr.data(), Dp, 1);
      pair_gemm<false>(Q.n_rows, K.n_cols, Dp / 2, ws.Qp.data(), Dp / 2, ws.Kd.data(), kTile,
                       ws.S.data(), kTile);
    } else {
      load_transposed(k + G.kv_at(b, K.start, g), ld, K.n, K.n_cols, D, Dp, ws.KT.data());
      load_rows(v + G.kv_at(b, K.start, g), ld, K.n, K.n_cols, D, Dp, 1.0f, ws.Vs.data());
      gemm_tile<false, false>(Q.n_rows, K.n_cols, Dp, ws.Qs.data(), Dp, ws.KT.data(), kTile,
                              ws.S.data(), kTile);
    }
    // S becomes P (unnormalised, relative to the running max); padding rows of S are zero.
    for (int64_t r = 0; r < Q.n; ++r) {
      const int64_t nc = causal_count(Q.start + r, K.start, K.n, G.shift);
      const int64_t lo = G.first_key(b, Q.start + r) - K.start;
      float* s = ws.S.data() + r * kTile;
      if (nc <= lo) {  // the row sees none of this tile: it adds nothing to O
        std::fill(s, s + K.n_cols, 0.0f);
        continue;
      }
      vfloat vmx = vsplat(ws.m[r]);
      const vfloat vscale = vsplat(sscale);  // x 1 in fp32: exact
      for (int64_t c0 = 0; c0 < K.n_cols; c0 += kLanes) {
        const vfloat x = vload(s + c0) * vscale;
        vmx = vselect(visible_lanes(c0, lo, nc) & (x > vmx), x, vmx);
      }
      const float mx = hmax(vmx);
      const bool first = ws.m[r] == kNoKey;
      const float corr = first ? 0.0f : std::exp(ws.m[r] - mx);
      vfloat sum = {};
      for (int64_t c0 = 0; c0 < K.n_cols; c0 += kLanes) {
        vfloat e = vselect(visible_lanes(c0, lo, nc), vexp(vload(s + c0) * vscale - mx), vfloat{});
        if constexpr (Bf16) e = round_bf16(e);  // the row sums the weights P V multiplies
        vstore(s + c0, e);
        sum += e;
      }
      ws.l[r] = ws.l[r] * corr + hsum(sum);
      ws.m[r] = mx;
      if (!first && corr != 1.0f) {
        float* o = ws.O.data() + r * Dp;
#pragma omp simd
        for (int64_t d = 0; d < Dp; ++d) o[d] *= corr;
      }
    }
    if constexpr (Bf16) {
      column_pairs(ws.S.data(), kTile, Q.n_rows, Q.n_rows, K.n_cols, K.n_cols / 2, ws.Pp.data(),
                   kTile / 2, 1);
      pair_gemm<true>(Q.n_rows, Dp, K.n_cols / 2, ws.Pp.data(), kTile / 2, ws.Vr.data(), Dp,
                      ws.O.data(), Dp);
    } else {
      gemm_tile<false, true>(Q.n_rows, Dp, K.n_cols, ws.S.data(), kTile, ws.Vs.data(), Dp,
                             ws.O.data(), Dp);
    }
  }
  for (int64_t r = 0; r < Q.n; ++r) {
    const int64_t at = G.q_at(b, Q.start + r, h);
    if (ws.m[r] == kNoKey) {  // no key of the block is visible to this row
      if (out16)
        std::fill(out16 + at, out16 + at + D, uint16_t(0));
      else
        std::fill(out + at, out + at + D, 0.0f);
      lse[G.stat_at(b, h, Q.start + r)] = kNoKey;
      continue;
    }
    const float inv = 1.0f / ws.l[r];
    const float* o = ws.O.data() + r * Dp;
    if (out16) {  // the fp32 row rounded once
      uint16_t* dst = out16 + at;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) dst[d] = uint16_t(bf16_tiles::bf16_bits(o[d] * inv));
    } else {
      float* dst = out + at;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) dst[d] = o[d] * inv;
    }
    lse[G.stat_at(b, h, Q.start + r)] = ws.m[r] + std::log(ws.l[r]);
  }
}

// ---- backward ---------------------------------------------------------------------------

// Read-only inputs of the backward plus the per-row Dvec = rowsum(dout * out); q, k, v of
// element type In (as forward_tile's).
template <class In>
struct BackwardArgs {
  const float* dout;
  const In *q, *k, *v;
  const float *lse, *dvec;
  Geometry G;
  float scale;
};

// Per-thread tile buffers: the current query tile (Qs = scale * q, dOs), key tile (KT, VT,
// Ks), the score tiles (P, dS) and the gradient accumulators. In bf16 the operand tiles are
// pairs instead (q unscaled: the scale multiplies the scores and dK): of columns (Qp, dOp;
// and Pp, dSp from P, dS), of rows (Qr, dOr, Kr), over d (Kd = k^T, Vd = v^T), and of P^T and
// dS^T (Pt, dSt).
template <bool Bf16>
struct BackwardScratch {
  std::vector<float> Qs, dOs, KT, VT, Ks, P, dS, dK, dV, dQ;
  std::vector<uint32_t> Qp, Qr, dOp, dOr, Kd, Vd, Kr, Pt, dSt, dSp;
  explicit BackwardScratch(int64_t Dp)
      : Qs(Bf16 ? 0 : kTile * Dp),
        dOs(Bf16 ? 0 : kTile * Dp),
        KT(Bf16 ? 0 : Dp * kTile),
        VT(Bf16 ? 0 : Dp * kTile),
        Ks(Bf16 ? 0 : kTile * Dp),
        P(kTile * kTile),
        dS(kTile * kTile),
        dK(kTile * Dp),
        dV(kTile * Dp),
        dQ(kTile * Dp) {
    if constexpr (Bf16)
      for (auto* t : {&Qp, &Qr, &dOp, &dOr, &Kd, &Vd, &Kr}) t->resize(kTile * Dp / 2);
    if constexpr (Bf16)
      for (auto* t : {&Pt, &dSt, &dSp}) t->resize(kTile * kTile / 2);
  }
};

template <bool Bf16, class In>
void load_query_tile(const BackwardArgs<In>& a, int64_t b, int64_t h, const TileRange& Q,
                     BackwardScratch<Bf16>& ws) {
  const Geometry& G = a.G;
  if constexpr (Bf16) {
    const In* q = a.q + G.q_at(b, Q.start, h);
    const float* dout = a.dout + G.q_at(b, Q.start, h);
    const int64_t ld = G.Hq * G.D, Dp = G.Dp;
    column_pairs(q, ld, Q.n, Q.n_rows, G.D, Dp / 2, ws.Qp.data(), Dp / 2, 1);
    row_pairs(q, ld, Q.n, Q.n_rows, G.D, Dp, ws.Qr.data(), Dp, 1);
    column_pairs(dout, ld, Q.n, Q.n_rows, G.D, Dp / 2, ws.dOp.data(), Dp / 2, 1);
    row_pairs(dout, ld, Q.n, Q.n_rows, G.D, Dp, ws.dOr.data(), Dp, 1);
  } else {
    load_rows(a.q + G.q_at(b, Q.start, h), G.Hq * G.D, Q.n, Q.n_rows, G.D, G.Dp, a.scale,
              ws.Qs.data());
    load_rows(a.dout + G.q_at(b, Q.start, h), G.Hq * G.D, Q.n, Q.n_rows, G.D, G.Dp, 1.0f,
              ws.dOs.data());
  }
}

template <bool Bf16, class In>
void load_key_tile(const BackwardArgs<In>& a, int64_t b, int64_t g, const TileRange& K,
                   BackwardScratch<Bf16>& ws) {
  const Geometry& G = a.G;
  const int64_t ld = G.Hkv * G.D;
  if constexpr (Bf16) {
    const In *k = a.k + G.kv_at(b, K.start, g), *v = a.v + G.kv_at(b, K.start, g);
    const int64_t Dp = G.Dp;
    column_pairs(k, ld, K.n, K.n_cols, G.D, Dp / 2, ws.Kd.data(), 1, kTile);
    column_pairs(v, ld, K.n, K.n_cols, G.D, Dp / 2, ws.Vd.data(), 1, kTile);
    row_pairs(k, ld, K.n, K.n_cols, G.D, Dp, ws.Kr.data(), Dp, 1);
  } else {
    load_transposed(a.k + G.kv_at(b, K.start, g), ld, K.n, K.n_cols, G.D, G.Dp, ws.KT.data());
    load_transposed(a.v + G.kv_at(b, K.start, g), ld, K.n, K.n_cols, G.D, G.Dp, ws.VT.data());
    load_rows(a.k + G.kv_at(b, K.start, g), ld, K.n, K.n_cols, G.D, G.Dp, 1.0f, ws.Ks.data());
  }
}

// For the loaded query tile (head h) against the loaded key tile: P = exp(scale Q K^T - lse)
// and dS = P * (dO V^T - Dvec) (without the factor scale), zero where masked or padded. The
// scores are computed as the forward computes them: (scale Q) K^T in fp32, scale (Q K^T) in bf16.
template <bool Bf16, class In>
void probs_and_dscores(const BackwardArgs<In>& a, int64_t b, int64_t h, const TileRange& Q,
                       const TileRange& K, BackwardScratch<Bf16>& ws) {
  const Geometry& G = a.G;
  if constexpr (Bf16) {
    const int64_t kp = G.Dp / 2;
    pair_gemm<false>(Q.n_rows, K.n_cols, kp, ws.Qp.data(), kp, ws.Kd.data(), kTile, ws.P.data(),
                     kTile);
    pair_gemm<false>(Q.n_rows, K.n_cols, kp, ws.dOp.data(), kp, ws.Vd.data(), kTile, ws.dS.data(),
                     kTile);
  } else {
    gemm_tile<false, false>(Q.n_rows, K.n_cols, G.Dp, ws.Qs.data(), G.Dp, ws.KT.data(), kTile,
                            ws.P.data(), kTile);
    gemm_tile<false, false>(Q.n_rows, K.n_cols, G.Dp, ws.dOs.data(), G.Dp, ws.VT.data(), kTile,
                            ws.dS.data(), kTile);
  }
  // Padding rows (r >= Q.n) are zero already: their Qs and dOs rows are zero.
  const vfloat vscale = vsplat(Bf16 ? a.scale : 1.0f);  // x 1 in fp32: exact
  for (int64_t r = 0; r < Q.n; ++r) {
    const int64_t i = Q.start + r, nc = causal_count(i, K.start, K.n, G.shift);
    const int64_t lo = G.first_key(b, i) - K.start;
    const float L = a.lse[G.stat_at(b, h, i)], Di = a.dvec[G.stat_at(b, h, i)];
    float* p = ws.P.data() + r * kTile;
    float* ds = ws.dS.data() + r * kTile;
    for (int64_t c0 = 0; c0 < K.n_cols; c0 += kLanes) {
      const vint keep = visible_lanes(c0, lo, nc);
      const vfloat e = vselect(keep, vexp(vload(p + c0) * vscale - L), vfloat{});
      vstore(p + c0, e);
      vstore(ds + c0, vselect(keep, e * (vload(ds + c0) - Di), vfloat{}));
    }
  }
}

// dV += P^T dO and dK += dS^T (scale Q) into the key-tile accumulators (bf16: dS^T Q, the
// scale applied when dK is stored).
template <bool Bf16, class In>
void accumulate_dkdv(const BackwardArgs<In>& a, const TileRange& Q, const TileRange& K,
                     BackwardScratch<Bf16>& ws) {
  const int64_t Dp = a.G.Dp;
  if constexpr (Bf16) {
    const int64_t kp = Q.n_rows / 2;
    row_pairs(ws.P.data(), kTile, Q.n_rows, Q.n_rows, K.n_cols, K.n_cols, ws.Pt.data(), 1,
              kTile / 2);
    row_pairs(ws.dS.data(), kTile, Q.n_rows, Q.n_rows, K.n_cols, K.n_cols, ws.dSt.data(), 1,
              kTile / 2);
    pair_gemm<true>(K.n_cols, Dp, kp, ws.Pt.data(), kTile / 2, ws.dOr.data(), Dp, ws.dV.data(), Dp);
    pair_gemm<true>(K.n_cols, Dp, kp, ws.dSt.data(), kTile / 2, ws.Qr.data(), Dp, ws.dK.data(), Dp);
    return;
  }
  gemm_tile<true, true>(K.n_cols, Dp, Q.n_rows, ws.P.data(), kTile, ws.dOs.data(), Dp, ws.dV.data(),
                        Dp);
  gemm_tile<true, true>(K.n_cols, Dp, Q.n_rows, ws.dS.data(), kTile, ws.Qs.data(), Dp, ws.dK.data(),
                        Dp);
}

// ws.dQ = (or +=) dS K for the query tile; the factor scale is applied when it is stored.
template <bool Accumulate, bool Bf16, class In>
void product_dq(const BackwardArgs<In>& a, const TileRange& Q, const TileRange& K,
                BackwardScratch<Bf16>& ws) {
  const int64_t Dp = a.G.Dp;
  if constexpr (Bf16) {
    column_pairs(ws.dS.data(), kTile, Q.n_rows, Q.n_rows, K.n_cols, K.n_cols / 2, ws.dSp.data(),
                 kTile / 2, 1);
    pair_gemm<Accumulate>(Q.n_rows, Dp, K.n_cols / 2, ws.dSp.data(), kTile / 2, ws.Kr.data(), Dp,
                          ws.dQ.data(), Dp);
    return;
  }
  gemm_tile<false, Accumulate>(Q.n_rows, Dp, K.n_cols, ws.dS.data(), kTile, ws.Ks.data(), Dp,
                               ws.dQ.data(), Dp);
}

// Writes (Add = false) or adds (Add = true) alpha times the first n rows, D columns of a
// local tile to the strided rows of a global tensor.
template <bool Add>
void store_rows(const float* tile, int64_t Dp, int64_t n, int64_t D, float alpha, float* dst,
                int64_t ld) {
  for (int64_t r = 0; r < n; ++r) {
    const float* src = tile + r * Dp;
    float* out = dst + r * ld;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) out[d] = Add ? out[d] + alpha * src[d] : alpha * src[d];
  }
}

template <bool Bf16, class In>
void forward_impl(const In* q, const In* k, const In* v, float* out, uint16_t* out16, float* lse,
                  const AttnShape& s, const int32_t* doc_start) {
  const Geometry G(s, doc_start);
  const int64_t nt = num_tiles(s.T), B = s.B, Hq = s.Hq;
  if (B == 0 || s.T == 0) return;
#pragma omp parallel
  {
    ForwardScratch<Bf16> ws(G.Dp);
    // Later query tiles see more keys; hand them out first.
#pragma omp for collapse(3) schedule(dynamic, 1)
    for (int64_t t = 0; t < nt; ++t)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < Hq; ++h)
          forward_tile<Bf16>(q, k, v, out, out16, lse, G, s.scale, b, h, nt - 1 - t, ws);
  }
}

// out: fp32, or out16 (bf16) when given.
template <bool Bf16, class In>
void backward_impl(const float* dout, const In* q, const In* k, const In* v, const float* out,
                   const uint16_t* out16, const float* lse, float* dq, float* dk, float* dv,
                   const AttnShape& s, const int32_t* doc_start) {
  const Geometry G(s, doc_start);
  const int64_t B = s.B, T = s.T, Tk = s.keys(), Hq = s.Hq, Hkv = s.Hkv, D = s.D;
  const int64_t nt = num_tiles(T), nkt = num_tiles(Tk);
  if (B == 0) return;
  const int64_t q_ld = Hq * D, kv_ld = Hkv * D;

  std::vector<float> dvec(B * Hq * T);
#pragma omp parallel for collapse(3) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < Hq; ++h) {
        const float* x = dout + G.q_at(b, t, h);
        const float* y = out16 ? nullptr : out + G.q_at(b, t, h);
        float acc = 0.0f;
        if (out16) {  // bf16: both as stored, dout as dP = dO V^T reads it
          const uint16_t* y16 = out16 + G.q_at(b, t, h);
#pragma omp simd reduction(+ : acc)
          for (int64_t d = 0; d < D; ++d)
            acc += half::from_bf16(half::to_bf16(x[d])) * half::from_bf16(y16[d]);
        } else if constexpr (Bf16) {  // the dout that dP = dO V^T reads
#pragma omp simd reduction(+ : acc)
          for (int64_t d = 0; d < D; ++d) acc += half::from_bf16(half::to_bf16(x[d])) * y[d];
        } else {
#pragma omp simd reduction(+ : acc)
          for (int64_t d = 0; d < D; ++d) acc += x[d] * y[d];
        }
        dvec[G.stat_at(b, h, t)] = acc;
      }
  const BackwardArgs<In> a{dout, q, k, v, lse, dvec.data(), G, s.scale};
  const float dk_scale = Bf16 ? s.scale : 1.0f;  // fp32: in the query copy already

  // Fused (one pass per (b, kv head); that item owns the dq rows of its query heads, so dq
  // is race-free) costs ~5 tile products per tile pair but offers only B*Hkv work items.
  // Split (dk/dv per key tile, then dq per query tile) costs ~7 but parallelises finely.
  // Pick whichever has the shorter critical path.
  int64_t threads = 1;
#ifdef _OPENMP
  threads = omp_get_max_threads();
#endif
  const int64_t items = B * Hkv, rounds = (items + threads - 1) / threads;
  const bool fused = rounds * 5 * threads <= 7 * items;

  if (fused) {
#pragma omp parallel
    {
      BackwardScratch<Bf16> ws(G.Dp);
#pragma omp for collapse(2) schedule(dynamic, 1)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t g = 0; g < Hkv; ++g) {
          const int64_t h_begin = g * G.group, h_end = h_begin + G.group;
          for (int64_t t = 0; t < T; ++t)
            std::fill_n(dq + G.q_at(b, t, h_begin), G.group * D, 0.0f);
          for (int64_t jb = 0; jb < nkt; ++jb) {
            const TileRange K(Tk, jb);
            load_key_tile(a, b, g, K, ws);
            std::fill(ws.dK.begin(), ws.dK.end(), 0.0f);
            std::fill(ws.dV.begin(), ws.dV.end(), 0.0f);
            for (int64_t h = h_begin; h < h_end; ++h)
              for (int64_t ib = 0; ib < nt; ++ib) {
                const TileRange Q(T, ib);
                if (!tiles_meet(Q, K, G.shift, tile_first_key(G, b, Q))) continue;
                load_query_tile(a, b, h, Q, ws);
                probs_and_dscores(a, b, h, Q, K, ws);
                accumulate_dkdv(a, Q, K, ws);
                product_dq<false, Bf16>(a, Q, K, ws);
                store_rows<true>(ws.dQ.data(), G.Dp, Q.n, D, s.scale, dq + G.q_at(b, Q.start, h),
                                 q_ld);
              }
            store_rows<false>(ws.dK.data(), G.Dp, K.n, D, dk_scale, dk + G.kv_at(b, K.start, g),
                              kv_ld);
            store_rows<false>(ws.dV.data(), G.Dp, K.n, D, 1.0f, dv + G.kv_at(b, K.start, g), kv_ld);
          }
        }
    }
    return;
  }

#pragma omp parallel
  {
    BackwardScratch<Bf16> ws(G.Dp);
    // dk, dv: one work item per key tile; earlier key tiles are seen by more queries.
#pragma omp for collapse(3) schedule(dynamic, 1)
    for (int64_t jb = 0; jb < nkt; ++jb)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t g = 0; g < Hkv; ++g) {
          const TileRange K(Tk, jb);
          load_key_tile(a, b, g, K, ws);
          std::fill(ws.dK.begin(), ws.dK.end(), 0.0f);
          std::fill(ws.dV.begin(), ws.dV.end(), 0.0f);
          for (int64_t h = g * G.group; h < (g + 1) * G.group; ++h)
            for (int64_t ib = 0; ib < nt; ++ib) {
              const TileRange Q(T, ib);
              if (!tiles_meet(Q, K, G.shift, tile_first_key(G, b, Q))) continue;
              load_query_tile(a, b, h, Q, ws);
              probs_and_dscores(a, b, h, Q, K, ws);
              accumulate_dkdv(a, Q, K, ws);
            }
          store_rows<false>(ws.dK.data(), G.Dp, K.n, D, dk_scale, dk + G.kv_at(b, K.start, g),
                            kv_ld);
          store_rows<false>(ws.dV.data(), G.Dp, K.n, D, 1.0f, dv + G.kv_at(b, K.start, g), kv_ld);
        }

#pragma omp for collapse(3) schedule(dynamic, 1)
    // dq: one work item per query tile; later query tiles see more keys.
    for (int64_t t = 0; t < nt; ++t)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < Hq; ++h) {
          const int64_t ib = nt - 1 - t, g = h / G.group;
          const TileRange Q(T, ib);
          load_query_tile(a, b, h, Q, ws);
          std::fill(ws.dQ.begin(), ws.dQ.end(), 0.0f);
          for (int64_t jb = std::min(nkt, tile_first_key(G, b, Q) / kTile); jb < nkt; ++jb) {
            const TileRange K(Tk, jb);
            if (!tiles_meet(Q, K, G.shift)) break;
            load_key_tile(a, b, g, K, ws);
            probs_and_dscores(a, b, h, Q, K, ws);
            product_dq<true, Bf16>(a, Q, K, ws);
          }
          store_rows<false>(ws.dQ.data(), G.Dp, Q.n, D, s.scale, dq + G.q_at(b, Q.start, h), q_ld);
        }
  }
}

}  // namespace

void attention_forward(const float* q, const float* k, const float* v, float* out, float* lse,
                       const AttnShape& s, const int32_t* doc_start) {
  if (s.compute == DType::bf16)
    return forward_impl<true>(q, k, v, out, nullptr, lse, s, doc_start);
  forward_impl<false>(q, k, v, out, nullptr, lse, s, doc_start);
}

void attention_backward(const float* dout, const float* q, const float* k, const float* v,
                        const float* out, const float* lse, float* dq, float* dk, float* dv,
                        const AttnShape& s, const int32_t* doc_start) {
  if (s.compute == DType::bf16)
    return backward_impl<true>(dout, q, k, v, out, nullptr, lse, dq, dk, dv, s, doc_start);
  backward_impl<false>(dout, q, k, v, out, nullptr, lse, dq, dk, dv, s, doc_start);
}

void attention_forward_bf16(const uint16_t* q, const uint16_t* k, const uint16_t* v, float* out,
                            uint16_t* out16, float* lse, const AttnShape& s,
                            const int32_t* doc_start) {
  forward_impl<true>(q, k, v, out, out16, lse, s, doc_start);
}

void attention_backward_bf16(const float* dout, const uint16_t* q, const uint16_t* k,
                             const uint16_t* v, const float* out, const uint16_t* out16,
                             const float* lse, float* dq, float* dk, float* dv, const AttnShape& s,
                             const int32_t* doc_start) {
  backward_impl<true>(dout, q, k, v, out, out16, lse, dq, dk, dv, s, doc_start);
}

void attention_merge(float* out, float* lse, const float* out_part, const float* lse_part,
                     int64_t B, int64_t T, int64_t H, int64_t D);

void register_attention(Backend& b) {
  b.attention_forward = attention_forward;
  b.attention_backward = attention_backward;
  b.attention_forward_bf16 = attention_forward_bf16;
  b.attention_backward_bf16 = attention_backward_bf16;
  b.attention_merge = attention_merge;  // cpu/attention_merge.cpp
}

}  // namespace tessera::kernels::cpu
