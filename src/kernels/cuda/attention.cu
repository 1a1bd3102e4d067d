// Causal attention on the GPU, FlashAttention-2 style, in fp32. For query row i of head h
// (key/value head g = h / (Hq/Hkv)):
//   s_ij = (scale q_i) . k_j (j <= i),   lse_i = log sum_j exp(s_ij),
//   out_i = sum_j exp(s_ij - lse_i) v_j.
// Nothing of size T x T is ever stored: every pass works on 64 x 64 tiles in shared memory.
//
// Forward: one block per (query tile, b, h). The block keeps its 64 query rows, scaled, in
// shared memory and walks the key tiles up to the diagonal; each thread holds 4 rows x 4
// columns of the score tile and 4 rows x D/16 columns of the output in registers, with the
// running row maximum and sum (online softmax). Only out and lse are written.
//
// Backward, with Dvec_i = dout_i . out_i, P = exp(S - lse), dS = P * (dO V^T - Dvec):
//   dV = P^T dO,  dK = dS^T (scale Q),  dQ = scale dS K.
// Two kernels instead of atomics: one block per (key tile, b, kv head) accumulates dK and dV
// over the query tiles at or after it and over the kv head's query heads (GQA), and one block
// per (query tile, b, h) accumulates dQ over the key tiles up to the diagonal. Each recomputes
// its probability tiles from lse. That costs 7 tile products per tile pair instead of 5, but
// no floating-point atomics: results are deterministic, and every score is computed by the
// same code (dot_tile: one fused multiply-add chain over d in order) in all three kernels, so
// the backward recomputes exactly the scores that the forward's lse normalised.
//
// Precision (AttnShape::compute): with bf16 the tile loads take q, k, v as stored in bf16 (or
// round fp32 ones) and round dout to bf16, the scale multiplies the fp32 scores (and dK)
// instead of the query copy, and P and dS are rounded to bf16 where they are stored for the
// products that read them, as on the CPU (cpu/attention.cpp); products of bf16 numbers are
// exact in fp32, so the fp32 fma chains then compute what a bf16 tensor-core product with fp32
// accumulation would, up to summation order. Scores, statistics and accumulators stay fp32;
// the output is written in fp32 or rounded once to bf16.
//
// Threads: 256 per block, as 16 rows (ty) x 16 columns (tx) of the tile; the 16 threads of one
// tile row are one half-warp, so row reductions are four shuffles. Shared-memory rows are padded
// by one float so that column walks hit distinct banks. Head dims up to 128 (padded with zeros
// to 32, 64 or 128); the largest configuration needs 146 KiB of shared memory per block.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/backend.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/cuda/context.hpp"

namespace tessera::kernels::cuda {
namespace {

using detail::stream;

constexpr int kTile = 64;        // query and key tile length
constexpr int kThreads = 256;    // 16 x 16
constexpr int kLdp = kTile + 1;  // row stride of the score tiles in shared memory

// T query rows, Tk key rows; query row i sees key row j when j <= i + shift
// (shift = q_pos0 - k_pos0, AttnShape) and, with document starts, j >= first_key(b, i).
struct Geometry {
  int64_t T, Tk, Hq, Hkv, D, group, shift, k_pos0;
  const int32_t* doc;  // [B, T] global position of each query row's document start, or null
  __host__ __device__ int64_t q_at(int64_t b, int64_t t, int64_t h) const {
    return ((b * T + t) * Hq + h) * D;
  }
  __host__ __device__ int64_t kv_at(int64_t b, int64_t t, int64_t g) const {
    return ((b * Tk + t) * Hkv + g) * D;
  }
  // Whether any query row of the tile at q0 sees any key of the tile at k0.
  __host__ __device__ bool tiles_meet(int64_t q0, int64_t k0) const {
    return k0 <= q0 + kTile - 1 + shift;
  }
  __host__ __device__ int64_t stat_at(int64_t b, int64_t h, int64_t t) const {
    return (b * Hq + h) * T + t;
  }
  // The first key row query row i of sequence b may see (0 without document starts or past T).
  __device__ int64_t first_key(int64_t b, int64_t i) const {
    if (!doc || i >= T) return 0;
    const int64_t f = int64_t(doc[b * T + i]) - k_pos0;
    return f > 0 ? f : 0;
  }
  // The least first key of the query tile at q0: key tiles wholly below it are skipped (the
  // same value in every thread of a block).
  __device__ int64_t tile_first_key(int64_t b, int64_t q0) const {
    if (!doc) return 0;
    int64_t first = first_key(b, q0);
    for (int64_t i = q0 + 1; i < q0 + kTile && i < T; ++i) {
      const int64_t f = first_key(b, i);
      first = f < first ? f : first;
    }
    return first;
  }
};

// x, or x rounded to bf16 (to nearest even) and widened back when bf16.
__device__ __forceinline__ float operand(float x, bool bf16) {
  return bf16 ? __bfloat162float(__float2bfloat16_rn(x)) : x;
}

__device__ __forceinline__ int ty() {
  return threadIdx.x >> 4;
}
__device__ __forceinline__ int tx() {
  return threadIdx.x & 15;
}

// A bf16 bit pattern widened (exactly).
__device__ __forceinline__ float widen(uint16_t x) {
  return __uint_as_float(uint32_t(x) << 16);
}
// An element of a tile operand: alpha x, rounded to bf16 when bf16 (fp32 x), or x as it is
// (bf16 x; alpha is then 1).
__device__ __forceinline__ float element(float x, float alpha, bool bf16) {
  return operand(alpha * x, bf16);
}
__device__ __forceinline__ float element(uint16_t x, float, bool) {
  return widen(x);
}

// dst[r][d] = alpha * src[(start + r) * ld + d] for start + r < T and d < D, else 0; r < kTile,
// d < kD, rounded to bf16 when bf16. src points at row t = 0 of the (b, head) being read.
template <int kD, class In>
__device__ void load_tile(float* dst, const In* src, int64_t ld, int64_t start, int64_t T,
                          int64_t D, float alpha, bool bf16) {
  constexpr int kLd = kD + 1;
  for (int idx = threadIdx.x; idx < kTile * kD; idx += kThreads) {
    const int r = idx / kD, d = idx % kD;
    const int64_t t = start + r;
    dst[r * kLd + d] = t < T && d < D ? element(src[t * ld + d], alpha, bf16) : 0.0f;
  }
}

// s[i][j] = sum_d A[ty*4 + i][d] * B[tx + 16 j][d], one fma chain in d order.
template <int kD>
__device__ __forceinline__ void dot_tile(const float* A, const float* B, float s[4][4]) {
  constexpr int kLd = kD + 1;
  const float* a_rows = A + ty() * 4 * kLd;
  const float* b_rows = B + tx() * kLd;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) s[i][j] = 0.0f;
#pragma unroll 4
  for (int d = 0; d < kD; ++d) {
    float a[4], b[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = a_rows[i * kLd + d];
#pragma unroll
    for (int j = 0; j < 4; ++j) b[j] = b_rows[16 * j * kLd + d];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) s[i][j] = fmaf(a[i], b[j], s[i][j]);
  }
}

// acc[i][c] += sum_j M[ty*4 + i][j] * X[j][tx + 16 c] for j < kTile; M has row stride kLdp.
template <int kD>
__device__ __forceinline__ void acc_product(const float* M, const float* X, float acc[4][kD / 16]) {
  constexpr int kLd = kD + 1;
  const float* m_rows = M + ty() * 4 * kLdp;
#pragma unroll 4
  for (int j = 0; j < kTile; ++j) {
    float m[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) m[i] = m_rows[i * kLdp + j];
#pragma unroll
    for (int c = 0; c < kD / 16; ++c) {
      const float x = X[j * kLd + tx() + 16 * c];
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[i][c] = fmaf(m[i], x, acc[i][c]);
    }
  }
}

// Stores the 4 x 4 register tile into a kTile x kLdp shared tile at the thread's places, as
// an operand of the next product (rounded to bf16 when bf16).
__device__ __forceinline__ void store_scores(float* S, const float s[4][4], bool bf16) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) S[(ty() * 4 + i) * kLdp + tx() + 16 * j] = operand(s[i][j], bf16);
}

// Reductions over the 16 threads of a tile row (one half-warp).
__device__ __forceinline__ float row_max16(float v) {
#pragma unroll
  for (int o = 1; o < 16; o <<= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float row_sum16(float v) {
#pragma unroll
  for (int o = 1; o < 16; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Writes rows t0 + ty*4 + i (< T), columns tx + 16 c (< D) of alpha * acc to dst (row stride
// ld), or rounded to bf16 to dst16 when given.
template <int kD>
__device__ void store_rows(float* dst, int64_t ld, int64_t t0, int64_t T, int64_t D, float alpha,
                           const float acc[4][kD / 16], uint16_t* dst16 = nullptr) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t t = t0 + ty() * 4 + i;
    if (t >= T) continue;
#pragma unroll
    for (int c = 0; c < kD / 16; ++c) {
      const int d = tx() + 16 * c;
      if (d >= D) continue;
      if (dst16)
        dst16[t * ld + d] = __bfloat16_as_ushort(__float2bfloat16_rn(alpha * acc[i][c]));
      else
        dst[t * ld + d] = alpha * acc[i][c];
    }
  }
}

// ---- forward ----------------------------------------------------------------------------------

template <int kD, class In>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(const In* q, const In* k, const In* v, float* out, uint16_t* out16,
                             float* lse, Geometry G, float scale, int64_t nt, int64_t nkt,
                             bool bf16) {
  constexpr int kLd = kD + 1;
  extern __shared__ float smem[];
  float* Qs = smem;
  float* Ks = Qs + kTile * kLd;
  float* Vs = Ks + kTile * kLd;
  float* Ps = Vs + kTile * kLd;
  const int64_t ib = nt - 1 - blockIdx.x;  // later query tiles (more work) first
  const int64_t b = blockIdx.y / G.Hq, h = blockIdx.y % G.Hq, g = h / G.group;
  const int64_t q0 = ib * kTile, q_ld = G.Hq * G.D, kv_ld = G.Hkv * G.D;

  // fp32: the scale is folded into the query copy; bf16: it multiplies the scores. As on the CPU.
  const float qscale = bf16 ? 1.0f : scale, sscale = bf16 ? scale : 1.0f;
  load_tile<kD>(Qs, q + G.q_at(b, 0, h), q_ld, q0, G.T, G.D, qscale, bf16);
  float o[4][kD / 16] = {};
  float m[4], l[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) m[i] = -INFINITY, l[i] = 0.0f;

  const int64_t jb0 = min(nkt, G.tile_first_key(b, q0) / kTile);  // earlier tiles: no row sees
  for (int64_t jb = jb0; jb < nkt && G.tiles_meet(q0, jb * kTile); ++jb) {
    const int64_t k0 = jb * kTile;
    __syncthreads();  // the previous tile's products are done with Ks, Vs, Ps
    load_tile<kD>(Ks, k + G.kv_at(b, 0, g), kv_ld, k0, G.Tk, G.D, 1.0f, bf16);
    load_tile<kD>(Vs, v + G.kv_at(b, 0, g), kv_ld, k0, G.Tk, G.D, 1.0f, bf16);
    __syncthreads();
    float s[4][4];
    dot_tile<kD>(Qs, Ks, s);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t qi = q0 + ty() * 4 + i, first = G.first_key(b, qi);
      float mx = m[i];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t kj = k0 + tx() + 16 * j;
        s[i][j] *= sscale;  // x 1 in fp32: exact
        if (kj > qi + G.shift || kj >= G.Tk || kj < first) s[i][j] = -INFINITY;
        mx = fmaxf(mx, s[i][j]);
      }
      // mx is -inf while the row has seen no key (a block of a longer sequence); the
      // exponentials are then taken against 0 so that they are 0, not NaN.
      mx = row_max16(mx);
      const float ref = mx == -INFINITY ? 0.0f : mx;
      const float corr = expf(m[i] - ref);  // 0 on the row's first visible tile (m = -inf)
      float rs = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        s[i][j] = operand(expf(s[i][j] - ref), bf16);  // masked: exp(-inf) = 0
        rs += s[i][j];  // bf16: the rounded weights, as on the CPU
      }
      l[i] = l[i] * corr + rs;  // this thread's columns only; summed over the row at the end
      m[i] = mx;
#pragma unroll
      for (int c = 0; c < kD / 16; ++c) o[i][c] *= corr;
    }
    store_scores(Ps, s, bf16);
    __syncthreads();
    acc_product<kD>(Ps, Vs, o);
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float sum = row_sum16(l[i]);
    const int64_t qi = q0 + ty() * 4 + i;
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;  // no key seen: out = 0, lse = -inf
#pragma unroll
    for (int c = 0; c < kD / 16; ++c) o[i][c] *= inv;
    if (qi < G.T && tx() == 0) lse[G.stat_at(b, h, qi)] = sum > 0.0f ? m[i] + logf(sum) : -INFINITY;
  }
  store_rows<kD>(out ? out + G.q_at(b, 0, h) : nullptr, q_ld, q0, G.T, G.D, 1.0f, o,
                 out16 ? out16 + G.q_at(b, 0, h) : nullptr);
}

// ---- backward ---------------------------------------------------------------------------------

// dvec[b, h, t] = dout[b, t, h, :] . out[b, t, h, :]; one warp per row.
// With bf16, dout is rounded as the products read it; out is f32, or bf16 (out16).
__global__ void attention_dvec_kernel(const float* dout, const float* out, const uint16_t* out16,
                                      float* dvec, Geometry G, int64_t rows, bool bf16) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; r < rows; r += warps) {
    const float* x = dout + r * G.D;
    float acc = 0.0f;
    for (int64_t d = lane; d < G.D; d += 32)
      acc += operand(x[d], bf16) * (out16 ? widen(out16[r * G.D + d]) : out[r * G.D + d]);
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) {
      const int64_t h = r % G.Hq, bt = r / G.Hq, t = bt % G.T, b = bt / G.T;
      dvec[G.stat_at(b, h, t)] = acc;
    }
  }
}

// Loads lse and Dvec of query rows [q0, q0 + kTile) of (b, h) into shared memory (0 past T).
__device__ void load_row_stats(float* lse_s, float* dvec_s, const float* lse, const float* dvec,
                               const Geometry& G, int64_t b, int64_t h, int64_t q0) {
  for (int r = threadIdx.x; r < kTile; r += kThreads) {
    const int64_t t = q0 + r;
    lse_s[r] = t < G.T ? lse[G.stat_at(b, h, t)] : 0.0f;
    dvec_s[r] = t < G.T ? dvec[G.stat_at(b, h, t)] : 0.0f;
  }
}

// One block per (key tile, b, kv head): dK and dV of its 64 keys.
template <int kD, class In>
__global__ void __launch_bounds__(kThreads)
    attention_dkdv_kernel(const float* dout, const In* q, const In* k, const In* v,
                          const float* lse, const float* dvec, float* dk, float* dv, Geometry G,
                          float scale, int64_t nt, bool bf16) {  // nt: query tiles
  constexpr int kLd = kD + 1;
  extern __shared__ float smem[];
  float* Ks = smem;
  float* Vs = Ks + kTile * kLd;
  float* Qs = Vs + kTile * kLd;
  float* dOs = Qs + kTile * kLd;
  float* St = dOs + kTile * kLd;  // P^T, then dS^T: [key][query]
  float* lse_s = St + kTile * kLdp;
  float* dvec_s = lse_s + kTile;
  const int64_t jb = blockIdx.x;  // earlier key tiles (seen by more queries) first
  const int64_t b = blockIdx.y / G.Hkv, g = blockIdx.y % G.Hkv;
  const int64_t k0 = jb * kTile, q_ld = G.Hq * G.D, kv_ld = G.Hkv * G.D;
  const float qscale = bf16 ? 1.0f : scale, sscale = bf16 ? scale : 1.0f;

  load_tile<kD>(Ks, k + G.kv_at(b, 0, g), kv_ld, k0, G.Tk, G.D, 1.0f, bf16);
  load_tile<kD>(Vs, v + G.kv_at(b, 0, g), kv_ld, k0, G.Tk, G.D, 1.0f, bf16);
  float dk_acc[4][kD / 16] = {}, dv_acc[4][kD / 16] = {};

  for (int64_t h = g * G.group; h < (g + 1) * G.group; ++h)
    for (int64_t ib = 0; ib < nt; ++ib) {
      const int64_t q0 = ib * kTile;
      // The same for the whole block: the key tile is in the future or before every document.
      if (!G.tiles_meet(q0, k0) || k0 + kTile <= G.tile_first_key(b, q0)) continue;
      __syncthreads();                      // the previous products are done with Qs, dOs, St
      load_tile<kD>(Qs, q + G.q_at(b, 0, h), q_ld, q0, G.T, G.D, qscale, bf16);
      load_tile<kD>(dOs, dout + G.q_at(b, 0, h), q_ld, q0, G.T, G.D, 1.0f, bf16);
      load_row_stats(lse_s, dvec_s, lse, dvec, G, b, h, q0);
      __syncthreads();
      // Transposed tiles: row i is key k0 + ty*4 + i, column j is query q0 + tx + 16 j.
      float p[4][4], ds[4][4];
      dot_tile<kD>(Ks, Qs, p);
      dot_tile<kD>(Vs, dOs, ds);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t kc = k0 + ty() * 4 + i;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int r = tx() + 16 * j;
          const int64_t qr = q0 + r;
          const bool keep = kc <= qr + G.shift && qr < G.T && kc < G.Tk && kc >= G.first_key(b, qr);
          p[i][j] = keep ? expf(p[i][j] * sscale - lse_s[r]) : 0.0f;
          ds[i][j] = p[i][j] * (ds[i][j] - dvec_s[r]);
        }
      }
      store_scores(St, p, bf16);
      __syncthreads();
      acc_product<kD>(St, dOs, dv_acc);  // dV += P^T dO
      __syncthreads();
      store_scores(St, ds, bf16);
      __syncthreads();
      acc_product<kD>(St, Qs, dk_acc);  // dK += dS^T (scale Q); bf16: dS^T Q
    }
  store_rows<kD>(dk + G.kv_at(b, 0, g), kv_ld, k0, G.Tk, G.D, sscale, dk_acc);
  store_rows<kD>(dv + G.kv_at(b, 0, g), kv_ld, k0, G.Tk, G.D, 1.0f, dv_acc);
}

// One block per (query tile, b, h): dQ of its 64 queries.
template <int kD, class In>
__global__ void __launch_bounds__(kThreads)
    attention_dq_kernel(const float* dout, const In* q, const In* k, const In* v, const float* lse,
                        const float* dvec, float* dq, Geometry G, float scale, int64_t nt,
                        int64_t nkt, bool bf16) {
  constexpr int kLd = kD + 1;
  extern __shared__ float smem[];
  float* Qs = smem;
  float* dOs = Qs + kTile * kLd;
  float* Ks = dOs + kTile * kLd;
  float* Vs = Ks + kTile * kLd;
  float* Ss = Vs + kTile * kLd;  // dS: [query][key]
  float* lse_s = Ss + kTile * kLdp;
  float* dvec_s = lse_s + kTile;
  const int64_t ib = nt - 1 - blockIdx.x;
  const int64_t b = blockIdx.y / G.Hq, h = blockIdx.y % G.Hq, g = h / G.group;
  const int64_t q0 = ib * kTile, q_ld = G.Hq * G.D, kv_ld = G.Hkv * G.D;
  const float qscale = bf16 ? 1.0f : scale, sscale = bf16 ? scale : 1.0f;

  load_tile<kD>(Qs, q + G.q_at(b, 0, h), q_ld, q0, G.T, G.D, qscale, bf16);
  load_tile<kD>(dOs, dout + G.q_at(b, 0, h), q_ld, q0, G.T, G.D, 1.0f, bf16);
  load_row_stats(lse_s, dvec_s, lse, dvec, G, b, h, q0);
  float dq_acc[4][kD / 16] = {};

  const int64_t jb0 = min(nkt, G.tile_first_key(b, q0) / kTile);
  for (int64_t jb = jb0; jb < nkt && G.tiles_meet(q0, jb * kTile); ++jb) {
    const int64_t k0 = jb * kTile;
    __syncthreads();  // the previous product is done with Ks, Ss
    load_tile<kD>(Ks, k + G.kv_at(b, 0, g), kv_ld, k0, G.Tk, G.D, 1.0f, bf16);
    load_tile<kD>(Vs, v + G.kv_at(b, 0, g), kv_ld, k0, G.Tk, G.D, 1.0f, bf16);
    __syncthreads();
    float p[4][4], ds[4][4];
    dot_tile<kD>(Qs, Ks, p);
    dot_tile<kD>(dOs, Vs, ds);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = ty() * 4 + i;
      const int64_t qr = q0 + r, first = G.first_key(b, qr);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t kc = k0 + tx() + 16 * j;
        const bool keep = kc <= qr + G.shift && qr < G.T && kc < G.Tk && kc >= first;
        const float e = keep ? expf(p[i][j] * sscale - lse_s[r]) : 0.0f;
        ds[i][j] = e * (ds[i][j] - dvec_s[r]);
      }
    }
    store_scores(Ss, ds, bf16);
    __syncthreads();
    acc_product<kD>(Ss, Ks, dq_acc);  // dQ += dS K
  }
  store_rows<kD>(dq + G.q_at(b, 0, h), q_ld, q0, G.T, G.D, scale, dq_acc);
}

// ---- launch -----------------------------------------------------------------------------------

template <int kD>
constexpr size_t forward_smem() {
  return sizeof(float) * (3 * kTile * (kD + 1) + kTile * kLdp);
}
template <int kD>
constexpr size_t backward_smem() {
  return sizeof(float) * (4 * kTile * (kD + 1) + kTile * kLdp + 2 * kTile);
}

// Raises the kernel's dynamic shared-memory limit to `bytes` after checking the device has it.
template <class Kernel>
void allow_shared(Kernel kernel, size_t bytes, const char* name) {
  TESSERA_REQUIRE_LOCAL(bytes <= current().max_shared_per_block(), name, " needs ", bytes,
                        " bytes of shared memory per block; this device allows ",
                        current().max_shared_per_block());
  TESSERA_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

Geometry geometry(const AttnShape& s, const int32_t* doc_start) {
  TESSERA_REQUIRE_LOCAL(s.B >= 0 && s.T >= 0 && s.Hq > 0 && s.Hkv > 0 && s.Hq % s.Hkv == 0,
                        "attention: bad shape B=", s.B, " T=", s.T, " Hq=", s.Hq, " Hkv=", s.Hkv);
  TESSERA_REQUIRE_LOCAL(s.D > 0 && s.D <= 128, "attention: head dim ", s.D,
                        " is not supported by the CUDA kernel (1..128)");
  TESSERA_REQUIRE_LOCAL(s.B * s.Hq <= 65535, "attention: B * Hq = ", s.B * s.Hq,
                        " exceeds the grid limit 65535");
  return Geometry{s.T,      s.keys(), s.Hq, s.Hkv, s.D, s.Hq / s.Hkv, s.q_pos0 - s.k_pos0,
                  s.k_pos0, doc_start};
}

int64_t num_tiles(int64_t T) {
  return (T + kTile - 1) / kTile;
}

template <int kD, class In>
void forward_impl(const In* q, const In* k, const In* v, float* out, uint16_t* out16, float* lse,
                  const AttnShape& s, const Geometry& G) {
  const int64_t nt = num_tiles(s.T), nkt = num_tiles(s.keys());
  const size_t bytes = forward_smem<kD>();
  allow_shared(attention_forward_kernel<kD, In>, bytes, "attention_forward_kernel");
  attention_forward_kernel<kD, In>
      <<<dim3(unsigned(nt), unsigned(s.B * s.Hq)), kThreads, bytes, stream()>>>(
          q, k, v, out, out16, lse, G, s.scale, nt, nkt, s.compute == DType::bf16);
  TESSERA_CUDA_LAUNCHED("attention_forward_kernel");
}

template <int kD, class In>
void backward_impl(const float* dout, const In* q, const In* k, const In* v, const float* dvec,
                   const float* lse, float* dq, float* dk, float* dv, const AttnShape& s,
                   const Geometry& G) {
  const int64_t nt = num_tiles(s.T), nkt = num_tiles(s.keys());
  const size_t bytes = backward_smem<kD>();
  allow_shared(attention_dkdv_kernel<kD, In>, bytes, "attention_dkdv_kernel");
  allow_shared(attention_dq_kernel<kD, In>, bytes, "attention_dq_kernel");
  attention_dkdv_kernel<kD, In>
      <<<dim3(unsigned(nkt), unsigned(s.B * s.Hkv)), kThreads, bytes, stream()>>>(
          dout, q, k, v, lse, dvec, dk, dv, G, s.scale, nt, s.compute == DType::bf16);
  TESSERA_CUDA_LAUNCHED("attention_dkdv_kernel");
  attention_dq_kernel<kD, In>
      <<<dim3(unsigned(nt), unsigned(s.B * s.Hq)), kThreads, bytes, stream()>>>(
          dout, q, k, v, lse, dvec, dq, G, s.scale, nt, nkt, s.compute == DType::bf16);
  TESSERA_CUDA_LAUNCHED("attention_dq_kernel");
}

// q, k, v of element type In (float, or uint16_t: bf16); out (f32) or out16 (bf16).
template <class In>
void forward_any(const In* q, const In* k, const In* v, float* out, uint16_t* out16, float* lse,
                 const AttnShape& s, const int32_t* doc_start) {
  const Geometry G = geometry(s, doc_start);
  if (s.B == 0 || s.T == 0) return;
  if (s.D <= 32)
    forward_impl<32>(q, k, v, out, out16, lse, s, G);
  else if (s.D <= 64)
    forward_impl<64>(q, k, v, out, out16, lse, s, G);
  else
    forward_impl<128>(q, k, v, out, out16, lse, s, G);
}

template <class In>
void backward_any(const float* dout, const In* q, const In* k, const In* v, const float* out,
                  const uint16_t* out16, const float* lse, float* dq, float* dk, float* dv,
                  const AttnShape& s, const int32_t* doc_start) {
  const Geometry G = geometry(s, doc_start);
  if (s.B == 0 || s.T == 0) return;
  const int64_t rows = s.B * s.T * s.Hq;
  float* dvec = static_cast<float*>(current().scratch(sizeof(float) * size_t(rows)));
  attention_dvec_kernel<<<detail::grid_for(rows * 32, 256), 256, 0, stream()>>>(
      dout, out, out16, dvec, G, rows, s.compute == DType::bf16);
  TESSERA_CUDA_LAUNCHED("attention_dvec_kernel");
  if (s.D <= 32)
    backward_impl<32>(dout, q, k, v, dvec, lse, dq, dk, dv, s, G);
  else if (s.D <= 64)
    backward_impl<64>(dout, q, k, v, dvec, lse, dq, dk, dv, s, G);
  else
    backward_impl<128>(dout, q, k, v, dvec, lse, dq, dk, dv, s, G);
}

}  // namespace

void attention_forward(const float* q, const float* k, const float* v, float* out, float* lse,
                       const AttnShape& s, const int32_t* doc_start) {
  forward_any(q, k, v, out, nullptr, lse, s, doc_start);
}

void attention_backward(const float* dout, const float* q, const float* k, const float* v,
                        const float* out, const float* lse, float* dq, float* dk, float* dv,
                        const AttnShape& s, const int32_t* doc_start) {
  backward_any(dout, q, k, v, out, nullptr, lse, dq, dk, dv, s, doc_start);
}

void attention_forward_bf16(const uint16_t* q, const uint16_t* k, const uint16_t* v, float* out,
                            uint16_t* out16, float* lse, const AttnShape& s,
                            const int32_t* doc_start) {
  forward_any(q, k, v, out, out16, lse, s, doc_start);
}

void attention_backward_bf16(const float* dout, const uint16_t* q, const uint16_t* k,
                             const uint16_t* v, const float* out, const uint16_t* out16,
                             const float* lse, float* dq, float* dk, float* dv, const AttnShape& s,
                             const int32_t* doc_start) {
  backward_any(dout, q, k, v, out, out16, lse, dq, dk, dv, s, doc_start);
}

// One thread per query row: the online-softmax merge of a block's (out, lse) into the running.
__global__ void attention_merge_kernel(float* out, float* lse, const float* out_part,
                                       const float* lse_part, int64_t B, int64_t T, int64_t H,
                                       int64_t D) {
  const int64_t rows = B * T * H;
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows;
       r += int64_t(gridDim.x) * blockDim.x) {
    const int64_t h = r % H, bt = r / H, t = bt % T, b = bt / T;
    const int64_t st = (b * H + h) * T + t;
    const float la = lse[st], lb = lse_part[st];
    if (lb == -INFINITY) continue;
    float* o = out + r * D;
    const float* p = out_part + r * D;
    if (la == -INFINITY) {
      for (int64_t d = 0; d < D; ++d) o[d] = p[d];
      lse[st] = lb;
      continue;
    }
    const float m = fmaxf(la, lb), wa = expf(la - m), wb = expf(lb - m), sum = wa + wb;
    const float ca = wa / sum, cb = wb / sum;
    for (int64_t d = 0; d < D; ++d) o[d] = ca * o[d] + cb * p[d];
    lse[st] = m + logf(sum);
  }
}

void attention_merge(float* out, float* lse, const float* out_part, const float* lse_part,
                     int64_t B, int64_t T, int64_t H, int64_t D) {
  const int64_t rows = B * T * H;
  if (rows == 0) return;
  attention_merge_kernel<<<detail::grid_for(rows, 256), 256, 0, stream()>>>(out, lse, out_part,
                                                                            lse_part, B, T, H, D);
  TESSERA_CUDA_LAUNCHED("attention_merge_kernel");
}

void register_attention(Backend& b) {
  b.attention_forward = attention_forward;
  b.attention_backward = attention_backward;
  b.attention_forward_bf16 = attention_forward_bf16;
  b.attention_backward_bf16 = attention_backward_bf16;
  b.attention_merge = attention_merge;
}

}  // namespace tessera::kernels::cuda
