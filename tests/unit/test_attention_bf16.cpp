// The CPU attention with bf16 products (AttnShape::compute = bf16), with and without document
// masks, against a plain loop in
// double over the operands the kernel multiplies: bf16(q), bf16(k), bf16(v), bf16(dout), the
// scores scale (q k^T), with P and dS rounded to bf16 where the kernel rounds them (kernels.hpp,
// "Precision"): in the forward P = exp(s - m) against the running maximum m over the 64-key
// tiles seen so far (the row sum adds the rounded P), in the backward P = exp(s - lse) with the
// kernel's own out and lse, as training passes them.
//
// The kernel takes q, k, v as bf16 tensors (a bf16 run keeps them so) or as f32 tensors that
// it rounds as it copies its tiles: both must give the same bits. With bf16 q, k, v it writes
// the output in f32 or in bf16; the bf16 output must be the f32 one rounded (bit for bit), and
// the backward that reads it is checked against the reference given that output.
//
// What is left between the two is fp32 summation (~1e-6) and, now and then, a value that
// lies within fp32 error of a bf16 rounding boundary and rounds the other way: one P or dS
// off by one bf16 ulp (2^-7 relative at most), in a few of the ~10^5 values a case rounds.
// Measured norm-wise (||kernel - ref|| / ||ref||) over these cases (Zen 5, AVX512-BF16): at
// most 1.4e-5 for out, 0.9e-5 for dq, 1.1e-5 for dk, 1.4e-5 for dv, 1e-6 for lse; the bar is
// kTol = 2e-4. Each test
// also runs the fp32 kernel on the same inputs, which differs from the reference by the bf16
// roundings themselves (each rounding is off by up to u = 2^-8 relative, ~u / sqrt(3) on
// average; through the sums that is 1.4e-3 to 3e-2 norm-wise here), and requires it above
// 2 kTol: a kernel that skipped a rounding would fail, so the bar sees the defect. (Computing
// Dvec from the unrounded dout, for one, puts dq and dk at 1e-3 to 1e-2.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "../test_vectors.hpp"
#include "core/error.hpp"
#include "kernels/cpu/bf16_tiles.hpp"
#include "kernels/kernels.hpp"
#include "tensor/half.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace tessera::kernels {
namespace {

using DVec = std::vector<double>;
using FVec = std::vector<float>;
using test::host;

constexpr double kTol = 2e-4;
constexpr int64_t kKeyTile = 64;  // the kernel's key tile (kernels.hpp)
constexpr double kNoKey = -std::numeric_limits<double>::infinity();

double bf16(double x) {
  return half::from_bf16(half::to_bf16(float(x)));
}

struct Case {
  int64_t B, T, Hq, Hkv, D;
  int64_t Tk = 0, q_pos0 = 0, k_pos0 = 0;  // a block of a longer sequence when set
  double input_std = 1.0;                  // of q and k
  float scale = 0.0f;                      // 0: 1/sqrt(D)
  // Document masks (kernels.hpp, doc_start): documents of doc_len tokens in global positions
  // (query row at p sees keys from p - p % doc_len on); 0: none.
  int64_t doc_len = 0;
  std::vector<int32_t> doc_start() const {
    std::vector<int32_t> d;
    for (int64_t b = 0; doc_len > 0 && b < B; ++b)
      for (int64_t i = 0; i < T; ++i) d.push_back(int32_t(q_pos0 + i - (q_pos0 + i) % doc_len));
    return d;
  }
  AttnShape shape(DType compute) const {
    const float sc = scale != 0.0f ? scale : float(1.0 / std::sqrt(double(D)));
    return {B, T, Hq, Hkv, D, sc, Tk, q_pos0, k_pos0, compute};
  }
  int64_t keys() const { return Tk > 0 ? Tk : T; }
  int64_t q_size() const { return B * T * Hq * D; }
  int64_t kv_size() const { return B * keys() * Hkv * D; }
  int64_t lse_size() const { return B * Hq * T; }
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "B" << c.B << " T" << c.T << " Tk" << c.keys() << " Hq" << c.Hq << " Hkv" << c.Hkv << " D"
      << c.D << " q_pos0 " << c.q_pos0 << " k_pos0 " << c.k_pos0 << " std " << c.input_std;
}

// The reference. Its operands are the kernel's rounded ones: qs = bf16(q), k, v, dout; the
// scale multiplies the scores.
struct Reference {
  Case c;
  AttnShape s;
  DVec qs, k, v, dout;
  std::vector<int32_t> doc;

  Reference(const Case& cs, const FVec& q, const FVec& kf, const FVec& vf, const FVec& df)
      : c(cs), s(cs.shape(DType::bf16)), doc(cs.doc_start()) {
    for (float x : q) qs.push_back(bf16(x));
    for (float x : kf) k.push_back(bf16(x));
    for (float x : vf) v.push_back(bf16(x));
    for (float x : df) dout.push_back(bf16(x));
  }
  int64_t qi(int64_t b, int64_t t, int64_t h) const { return ((b * s.T + t) * s.Hq + h) * s.D; }
  int64_t ki(int64_t b, int64_t t, int64_t g) const {
    return ((b * c.keys() + t) * s.Hkv + g) * s.D;
  }
  int64_t si(int64_t b, int64_t h, int64_t t) const { return (b * s.Hq + h) * s.T + t; }
  int64_t head(int64_t h) const { return h / (s.Hq / s.Hkv); }
  // Keys of query row i: first(b, i) <= j < visible(i).
  int64_t visible(int64_t i) const {
    return std::clamp<int64_t>(s.q_pos0 + i - s.k_pos0 + 1, 0, c.keys());
  }
  int64_t first(int64_t b, int64_t i) const {
    return doc.empty() ? 0 : std::max<int64_t>(0, doc[size_t(b * s.T + i)] - s.k_pos0);
  }
  double score(int64_t b, int64_t h, int64_t i, int64_t j) const {
    double acc = 0;
    for (int64_t d = 0; d < s.D; ++d) acc += qs[qi(b, i, h) + d] * k[ki(b, j, head(h)) + d];
    return double(s.scale) * acc;
  }

  void forward(DVec& out, DVec& lse) const {
    out.assign(c.q_size(), 0.0);
    lse.assign(c.lse_size(), kNoKey);
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t h = 0; h < s.Hq; ++h)
        for (int64_t i = 0; i < s.T; ++i) {
          const int64_t n = visible(i), lo = first(b, i);
          if (n <= lo) continue;
          DVec sc(n, kNoKey), p(n, 0.0);
          for (int64_t j = lo; j < n; ++j) sc[j] = score(b, h, i, j);
          const double m = *std::max_element(sc.begin(), sc.end());
          double l = 0, run = kNoKey;
          // The running maximum per key tile (tiles at multiples of 64 keys, from the first
          // tile the row sees).
          for (int64_t j0 = lo / kKeyTile * kKeyTile; j0 < n; j0 += kKeyTile) {
            const int64_t j1 = std::min(n, j0 + kKeyTile);
            run = std::max(run, *std::max_element(sc.begin() + j0, sc.begin() + j1));
            for (int64_t j = std::max(j0, lo); j < j1; ++j) {
              p[j] = bf16(std::exp(sc[j] - run)) * std::exp(run - m);
              l += p[j];  // the kernel sums the rounded values
            }
          }
          for (int64_t j = lo; j < n; ++j)
            for (int64_t d = 0; d < s.D; ++d)
              out[qi(b, i, h) + d] += p[j] * v[ki(b, j, head(h)) + d];
          for (int64_t d = 0; d < s.D; ++d) out[qi(b, i, h) + d] /= l;
          lse[si(b, h, i)] = m + std::log(l);
        }
  }

  // With the kernel's out and lse.
  void backward(const FVec& out, const FVec& lse, DVec& dq, DVec& dk, DVec& dv) const {
    dq.assign(c.q_size(), 0.0);
    dk.assign(c.kv_size(), 0.0);
    dv.assign(c.kv_size(), 0.0);
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t h = 0; h < s.Hq; ++h)
        for (int64_t i = 0; i < s.T; ++i) {
          const int64_t g = head(h), n = visible(i), r = qi(b, i, h);
          double dvec = 0;
          for (int64_t d = 0; d < s.D; ++d) dvec += dout[r + d] * out[r + d];
          for (int64_t j = first(b, i); j < n; ++j) {
            const double p = std::exp(score(b, h, i, j) - lse[si(b, h, i)]);
            double dp = 0;
            for (int64_t d = 0; d < s.D; ++d) dp += dout[r + d] * v[ki(b, j, g) + d];
            const double pb = bf16(p), ds = bf16(p * (dp - dvec));
            for (int64_t d = 0; d < s.D; ++d) {
              dv[ki(b, j, g) + d] += pb * dout[r + d];
              dq[r + d] += s.scale * ds * k[ki(b, j, g) + d];
              dk[ki(b, j, g) + d] += s.scale * ds * qs[r + d];
            }
          }
        }
  }
};

// ||a - ref|| / ||ref|| (0 when both are 0).
double normwise(const FVec& a, const DVec& ref) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    norm += ref[i] * ref[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

struct Run {
  FVec out, lse, dq, dk, dv;
};

using HVec = std::vector<uint16_t>;
HVec to_bf16(const FVec& x) {
  HVec y;
  for (float v : x) y.push_back(half::to_bf16(v));
  return y;
}
FVec widen(const HVec& x) {
  FVec y;
  for (uint16_t v : x) y.push_back(half::from_bf16(v));
  return y;
}
Tensor bf16_view(const HVec& v) {
  return view_of(v.data(), DType::bf16, Shape{int64_t(v.size())});
}

// How the kernel is given q, k, v and its output: f32 tensors, bf16 q, k, v with an f32
// output, or bf16 q, k, v and output (the output of Run is then the bf16 one, widened).
enum class Io { f32, bf16_in, bf16_all };

Run run_kernel(const Case& c, DType compute, const FVec& q, const FVec& k, const FVec& v,
               const FVec& dout, Io io = Io::f32) {
  const float nan = std::numeric_limits<float>::quiet_NaN();  // unwritten outputs show up
  Run r{FVec(c.q_size(), nan), FVec(c.lse_size(), nan), FVec(c.q_size(), nan),
        FVec(c.kv_size(), nan), FVec(c.kv_size(), nan)};
  const AttnShape s = c.shape(compute);
  const std::vector<int32_t> doc = c.doc_start();
  const Tensor d = doc.empty() ? Tensor{} : host(doc);
  if (io == Io::f32) {
    attention_forward(host(q), host(k), host(v), host(r.out), host(r.lse), s, d);
    attention_backward(host(dout), host(q), host(k), host(v), host(r.out), host(r.lse),
                       host(r.dq), host(r.dk), host(r.dv), s, d);
    return r;
  }
  const HVec qb = to_bf16(q), kb = to_bf16(k), vb = to_bf16(v);
  HVec out16(c.q_size(), 0x7fc0);  // NaN
  const Tensor out = io == Io::bf16_all ? bf16_view(out16) : host(r.out);
  attention_forward(bf16_view(qb), bf16_view(kb), bf16_view(vb), out, host(r.lse), s, d);
  attention_backward(host(dout), bf16_view(qb), bf16_view(kb), bf16_view(vb), out, host(r.lse),
                     host(r.dq), host(r.dk), host(r.dv), s, d);
  if (io == Io::bf16_all) r.out = widen(out16);
  return r;
}

bool same_bits(const FVec& a, const FVec& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](float x, float y) {
           return half::bits(x) == half::bits(y);
         });
}

// The kernel's bf16 q, k, v against its f32 ones (the same bits), and its bf16 output against
// its f32 one rounded; the backward from the bf16 output against the reference given it.
void check_bf16_io(const Case& c, const Reference& ref, const Run& f32_in, const FVec& q,
                   const FVec& k, const FVec& v, const FVec& dout) {
  const Run in = run_kernel(c, DType::bf16, q, k, v, dout, Io::bf16_in);
  for (const auto& [a, b, name] : {std::tuple{&in.out, &f32_in.out, "out"},
                                   std::tuple{&in.lse, &f32_in.lse, "lse"},
                                   std::tuple{&in.dq, &f32_in.dq, "dq"},
                                   std::tuple{&in.dk, &f32_in.dk, "dk"},
                                   std::tuple{&in.dv, &f32_in.dv, "dv"}})
    EXPECT_TRUE(same_bits(*a, *b)) << name << ": bf16 q, k, v and f32 ones rounded differ";
  const Run all = run_kernel(c, DType::bf16, q, k, v, dout, Io::bf16_all);
  EXPECT_TRUE(same_bits(all.out, widen(to_bf16(f32_in.out))))
      << "the bf16 output is not the f32 output rounded";
  EXPECT_TRUE(same_bits(all.lse, f32_in.lse)) << "lse";
  DVec dq, dk, dv;
  ref.backward(all.out, all.lse, dq, dk, dv);
  EXPECT_LE(normwise(all.dq, dq), kTol) << "dq from the bf16 output";
  EXPECT_LE(normwise(all.dk, dk), kTol) << "dk from the bf16 output";
  EXPECT_LE(normwise(all.dv, dv), kTol) << "dv from the bf16 output";
}

// Forward and backward of the bf16 kernel against the reference, and the fp32 kernel away
// from it.
void check(const Case& c) {
  const FVec q = test::randn(c.q_size(), 31, c.input_std);
  const FVec k = test::randn(c.kv_size(), 32, c.input_std);
  const FVec v = test::randn(c.kv_size(), 33), dout = test::randn(c.q_size(), 34);
  const Reference ref(c, q, k, v, dout);
  const Run bf = run_kernel(c, DType::bf16, q, k, v, dout);
  DVec out, lse, dq, dk, dv;
  ref.forward(out, lse);
  ref.backward(bf.out, bf.lse, dq, dk, dv);
  const double e_out = normwise(bf.out, out), e_dq = normwise(bf.dq, dq),
               e_dk = normwise(bf.dk, dk), e_dv = normwise(bf.dv, dv);
  EXPECT_LE(e_out, kTol) << "out";
  EXPECT_LE(e_dq, kTol) << "dq";
  EXPECT_LE(e_dk, kTol) << "dk";
  EXPECT_LE(e_dv, kTol) << "dv";
  // lse: -inf exactly where no key is visible, else norm-wise (a flip moves one row's lse by
  // up to 2^-7 P / l).
  FVec lse_seen;
  DVec lse_want;
  for (size_t i = 0; i < lse.size(); ++i) {
    if (lse[i] == kNoKey) {
      EXPECT_EQ(bf.lse[i], -std::numeric_limits<float>::infinity()) << "lse " << i;
      continue;
    }
    lse_seen.push_back(bf.lse[i]);
    lse_want.push_back(lse[i]);
  }
  EXPECT_LE(normwise(lse_seen, lse_want), kTol) << "lse";
  check_bf16_io(c, ref, bf, q, k, v, dout);

  // The same inputs through the fp32 kernel: far from the bf16 reference, for every output
  // the reference does not have at zero (the gradients of a single key, a block wholly in the
  // future).
  const Run f32 = run_kernel(c, DType::f32, q, k, v, dout);
  const auto away = [](const FVec& a, const DVec& ref, const char* name) {
    if (std::none_of(ref.begin(), ref.end(), [](double x) { return x != 0.0; })) return;
    EXPECT_GT(normwise(a, ref), 2 * kTol) << "the fp32 kernel's " << name;
  };
  away(f32.out, out, "out");
  away(f32.dq, dq, "dq");
  away(f32.dk, dk, "dk");
  away(f32.dv, dv, "dv");
}

class AttentionBf16 : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionBf16, MatchesBf16Reference) {
  check(GetParam());
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionBf16,
    ::testing::Values(Case{1, 1, 1, 1, 8},                         // single token
                      Case{2, 7, 2, 2, 8},                         // T < tile
                      Case{1, 70, 2, 1, 7},                        // odd D, MQA
                      Case{2, 64, 4, 4, 64},                       // exactly one tile
                      Case{2, 130, 4, 2, 64},                      // ragged last tile, GQA
                      Case{1, 100, 3, 1, 20},                      // D padded to 32, Hq = 3
                      Case{1, 200, 2, 1, 16, 0, 0, 0, 2.0, 1.0f},  // sharp softmax
                      // blocks of a longer sequence (context parallelism):
                      Case{2, 70, 4, 2, 32, 130, 130, 0},   // every key visible
                      Case{1, 90, 2, 1, 64, 150, 100, 70},  // ragged, partly visible
                      Case{2, 64, 2, 2, 64, 64, 64, 64},    // diagonal block
                      Case{1, 8, 2, 2, 16, 8, 24, 8},       // zigzag chunk
                      Case{1, 5, 2, 2, 16, 5, 0, 5},        // wholly in the future
                      // document masks: documents of 50 and 37 tokens, and a block whose
                      // rows' document (from 100) skips its first key tile
                      Case{1, 200, 2, 1, 32, 0, 0, 0, 1.0, 0.0f, 50},
                      Case{2, 130, 4, 2, 16, 0, 0, 0, 1.0, 0.0f, 37},
                      Case{1, 64, 2, 2, 32, 192, 128, 0, 1.0, 0.0f, 100}),
    [](const ::testing::TestParamInfo<Case>& info) {
      const Case& c = info.param;
      return "B" + std::to_string(c.B) + "T" + std::to_string(c.T) + "Tk" +
             std::to_string(c.keys()) + "Hq" + std::to_string(c.Hq) + "Hkv" +
             std::to_string(c.Hkv) + "D" + std::to_string(c.D) + "_" + std::to_string(info.index);
    });

// The tile products the bf16 core is made of (bf16_tiles::pair_gemm), on the matrix engine
// where it is used (AMX: m, n and the pairs multiples of 16; the 2 x 2 and the single 16 x 16
// blocks) and on the vector unit otherwise (m = 8, or pairs not a multiple of 16), against a
// double loop over the same bf16 pairs, writing C and adding to it; operands with row strides
// wider than the block, as the attention's tiles are.
TEST(Bf16Tiles, PairGemmIsTheProduct) {
#if defined(TESSERA_AMX)
  std::printf("pair_gemm on the matrix engine: %s\n",
              cpu::bf16_tiles::amx::usable() ? "yes (AMX)" : "no");
#endif
  std::mt19937 gen(5);
  std::normal_distribution<float> normal;
  for (const auto& [m, n, kp] : {std::tuple<int64_t, int64_t, int64_t>{64, 64, 32}, {48, 48, 16},
                                 {16, 32, 48}, {32, 16, 16}, {8, 16, 4}, {16, 16, 8}}) {
    const int64_t lda = kp + 16, ldb = n + 16, ldc = n + 8;
    std::vector<uint32_t> A(size_t(m * lda)), B(size_t(kp * ldb));
    for (auto& x : A) x = cpu::bf16_tiles::pack(normal(gen), normal(gen));
    for (auto& x : B) x = cpu::bf16_tiles::pack(normal(gen), normal(gen));
    FVec C0(size_t(m * ldc));
    for (auto& x : C0) x = normal(gen);
    for (const bool acc : {false, true}) {
      FVec C = C0;
      if (acc)
        cpu::bf16_tiles::pair_gemm<true>(m, n, kp, A.data(), lda, B.data(), ldb, C.data(), ldc);
      else
        cpu::bf16_tiles::pair_gemm<false>(m, n, kp, A.data(), lda, B.data(), ldb, C.data(), ldc);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < ldc; ++j) {
          const float got = C[size_t(i * ldc + j)];
          if (j >= n) {  // beyond the block: untouched
            ASSERT_EQ(got, C0[size_t(i * ldc + j)]) << m << "x" << n << "x" << kp;
            continue;
          }
          double want = acc ? C0[size_t(i * ldc + j)] : 0.0, mag = std::abs(want);
          for (int64_t p = 0; p < kp; ++p) {
            const uint32_t a = A[size_t(i * lda + p)], b = B[size_t(p * ldb + j)];
            const double t = double(cpu::bf16_tiles::low(a)) * cpu::bf16_tiles::low(b) +
                             double(cpu::bf16_tiles::high(a)) * cpu::bf16_tiles::high(b);
            want += t;
            mag += std::abs(t);
          }
          // fp32 sums of 2 kp exact products (and C): within (2 kp + 1) u of their magnitudes.
          ASSERT_NEAR(got, want, double(2 * kp + 1) * 0x1p-24 * mag)
              << m << "x" << n << "x" << kp << (acc ? " +=" : " =") << " at " << i << "," << j;
        }
    }
  }
}

#ifdef _OPENMP
// Both backward schedules (fused with one thread, split with two; test_attention.cpp).
TEST(AttentionBf16Schedules, FusedAndSplitMatchReference) {
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << "threads=" << threads);
    omp_set_num_threads(threads);
    check(Case{1, 130, 4, 1, 64});
    check(Case{1, 90, 2, 1, 64, 150, 100, 70});
  }
  omp_set_num_threads(saved);
}
#endif

TEST(AttentionBf16Api, Fp16ComputeIsAnError) {
  const Case c{1, 4, 1, 1, 8};
  FVec x(c.q_size()), lse(c.lse_size());
  EXPECT_THROW(
      attention_forward(host(x), host(x), host(x), host(x), host(lse), c.shape(DType::f16)), Error);
}

// bf16 q, k, v need the bf16 compute; a bf16 output needs bf16 q, k, v.
TEST(AttentionBf16Api, Bf16TensorsNeedTheBf16Compute) {
  const Case c{1, 4, 1, 1, 8};
  FVec x(c.q_size()), lse(c.lse_size());
  HVec h(c.q_size());
  EXPECT_THROW(attention_forward(bf16_view(h), bf16_view(h), bf16_view(h), host(x), host(lse),
                                 c.shape(DType::f32)),
               Error);
  EXPECT_THROW(attention_forward(host(x), host(x), host(x), bf16_view(h), host(lse),
                                 c.shape(DType::bf16)),
               Error);
  EXPECT_NO_THROW(attention_forward(bf16_view(h), bf16_view(h), bf16_view(h), bf16_view(h),
                                    host(lse), c.shape(DType::bf16)));
}

// RoPE with a bf16 output (a bf16 run's q and k): the fp32 rotation rounded, bit for bit, and
// the input left as it was; by position range and by per-token positions.
TEST(RopeBf16Output, IsTheFp32RotationRounded) {
  const int64_t B = 2, T = 5, H = 3, D = 8, n = B * T * H * D;
  const FVec x = test::randn(n, 41);
  FVec in_place = x, kept = x;
  HVec y(n, 0x7fc0);
  rope(host(in_place), B, T, H, D, 7, 10000.0f, false);
  rope(host(kept), B, T, H, D, 7, 10000.0f, false, bf16_view(y));
  EXPECT_TRUE(same_bits(kept, x));
  EXPECT_TRUE(same_bits(widen(y), widen(to_bf16(in_place))));
  std::vector<int32_t> pos;
  for (int64_t i = 0; i < B * T; ++i) pos.push_back(int32_t(i % 3));
  FVec at = x;
  rope_at(host(at), host(pos), B * T, H, D, 10000.0f, true);
  rope_at(host(kept), host(pos), B * T, H, D, 10000.0f, true, bf16_view(y));
  EXPECT_TRUE(same_bits(kept, x));
  EXPECT_TRUE(same_bits(widen(y), widen(to_bf16(at))));
}

}  // namespace
}  // namespace tessera::kernels
