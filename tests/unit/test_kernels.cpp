// Tests the CPU kernels of kernels/kernels.hpp against naive loops in double precision: the GEMM
// (oneDNN) and, in the Kokkos* suites, the Kokkos kernels of kernels/kokkos/ in the host space,
// whose source the CUDA space shares (attention: test_attention.cpp; the cross-entropy and AdamW:
// test_kernels_loss.cpp). Backward kernels are checked against central differences of the
// double-precision forward, so the reference gradients do not share a derivation with the code
// under test. fp32 results must agree to a relative ~1e-5.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernel_checks.hpp"
#include "kernels/kernels.hpp"
#include "tensor/half.hpp"

namespace tessera::kernels {
namespace {

using namespace check;
using test::FVec;
using test::host;
using test::randn;

// ---- GEMM -------------------------------------------------------------------------------

struct GemmCase {
  int64_t M, N, K;
  bool ta, tb;
  float alpha, beta;
};

void check_matmul(const GemmCase& c, uint32_t seed) {
  const FVec A = randn(c.M * c.K, seed), B = randn(c.K * c.N, seed + 1);
  const FVec C0 = randn(c.M * c.N, seed + 2);
  FVec C = C0;
  matmul(host(A), host(B), host(C), c.M, c.N, c.K, c.ta, c.tb, c.alpha, c.beta);
  // op(A)[i][k]: A is [M,K], or [K,M] when transposed; op(B)[k][j]: B is [K,N] or [N,K].
  auto a = [&](int64_t i, int64_t k) { return double(c.ta ? A[k * c.M + i] : A[i * c.K + k]); };
  auto b = [&](int64_t k, int64_t j) { return double(c.tb ? B[j * c.K + k] : B[k * c.N + j]); };
  const std::string what = "C(M" + std::to_string(c.M) + " N" + std::to_string(c.N) + " K" +
                           std::to_string(c.K) + (c.ta ? " At" : " A") + (c.tb ? " Bt)" : " B)");
  int reported = 0;
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) {
      double acc = 0, mag = 0;  // mag: the error scale of an fp32 dot product
      for (int64_t k = 0; k < c.K; ++k) {
        acc += a(i, k) * b(k, j);
        mag += std::abs(a(i, k) * b(k, j));
      }
      const double want = c.alpha * acc + c.beta * C0[i * c.N + j];
      const double scale = std::abs(c.alpha) * mag + std::abs(c.beta * C0[i * c.N + j]);
      const double got = C[i * c.N + j];
      if (!(std::abs(got - want) <= kRel * scale) && reported++ < 5)
        ADD_FAILURE() << what << "[" << i << "," << j << "] = " << got << ", expected " << want;
    }
}

TEST(KernelMatmul, AllTransposeCombinationsWithAlphaBeta) {
  uint32_t seed = 10;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_matmul({7, 5, 9, ta, tb, 1.0f, 0.0f}, seed += 3);
      check_matmul({7, 5, 9, ta, tb, 0.5f, -1.5f}, seed += 3);
      check_matmul({1, 13, 3, ta, tb, -2.0f, 1.0f}, seed += 3);
      check_matmul({67, 45, 130, ta, tb, 1.25f, 0.75f}, seed += 3);
    }
}

TEST(KernelMatmul, BetaZeroIgnoresOldC) {
  // C may hold garbage (a reused scratch buffer): beta = 0 must overwrite, not scale it.
  const int64_t M = 6, N = 4, K = 5;
  const FVec A = randn(M * K, 1), B = randn(K * N, 2);
  FVec C(M * N, kNaN);
  matmul(host(A), host(B), host(C), M, N, K, false, false);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double want = 0;
      for (int64_t k = 0; k < K; ++k) want += double(A[i * K + k]) * B[k * N + j];
      EXPECT_NEAR(C[i * N + j], want, 1e-5 * (1 + std::abs(want))) << i << "," << j;
    }
}

TEST(KernelMatmul, EmptyOutputIsANoOp) {
  FVec C = {1.0f, 2.0f};
  matmul(Tensor{}, Tensor{}, host(C), 0, 2, 3, false, false, 1.0f, 0.0f);
  matmul(Tensor{}, Tensor{}, host(C), 2, 0, 3, false, false, 1.0f, 0.0f);
  EXPECT_EQ(C, (FVec{1.0f, 2.0f}));
}

// ---- elementwise and reductions -----------------------------------------------------------

TEST(KokkosElementwise, FillCopyAddScale) {
  const int64_t n = 1003;  // not a multiple of any vector width
  FVec x(n, kNaN);
  fill(host(x), 2.5f, n);
  for (float v : x) ASSERT_EQ(v, 2.5f);

  const FVec a = randn(n, 3), b = randn(n, 4);
  FVec y(n, kNaN);
  copy(host(a), host(y), n);
  EXPECT_EQ(y, a);

  add_inplace(host(y), host(b), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], a[i] + b[i]) << i;

  y = a;
  scale_inplace(host(y), -0.375f, n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], a[i] * -0.375f) << i;

  // n = 0 touches nothing.
  fill(host(x), 7.0f, 0);
  EXPECT_EQ(x[0], 2.5f);
}

TEST(KokkosElementwise, SumSquaresIsAccumulatedInDouble) {
  const int64_t n = 100003;
  FVec x = randn(n, 5, 3.0);
  x[17] = 1e4f;  // one large value next to many small ones: fp32 accumulation would lose digits
  double want = 0;
  for (float v : x) want += double(v) * double(v);
  EXPECT_NEAR(sum_squares(host(x), n), want, 1e-12 * want);
  EXPECT_EQ(sum_squares(host(x), 0), 0.0);
}

TEST(KokkosElementwise, BiasAdd) {
  for (int64_t C : {1, 19, 64}) {
    const int64_t N = 37;
    const FVec y0 = randn(N * C, 6), b = randn(C, 7);
    FVec y = y0;
    bias_add(host(y), host(b), N, C);
    for (int64_t r = 0; r < N; ++r)
      for (int64_t c = 0; c < C; ++c) ASSERT_EQ(y[r * C + c], y0[r * C + c] + b[c]);
  }
}

TEST(KokkosElementwise, BiasBackwardAccumulatesColumnSums) {
  for (int64_t C : {1, 19, 64}) {
    const int64_t N = 37;
    const FVec dy = randn(N * C, 8);
    FVec db = randn(C, 9);
    DVec want = to_double(db);
    for (int64_t r = 0; r < N; ++r)
      for (int64_t c = 0; c < C; ++c) want[c] += dy[r * C + c];
    bias_backward(host(dy), host(db), N, C);
    expect_close(db, want, kRel, -1, "db C=" + std::to_string(C));
  }
}

TEST(KokkosElementwise, CopyRowsCopiesABlockOfAWiderMatrix) {
  const int64_t rows = 7, ldx = 13, ldy = 9, cols = 9;
  const FVec x = randn(rows * ldx, 10);
  FVec y(rows * ldy, kNaN);
  copy_rows(host(x), ldx, host(y), ldy, rows, cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(y[r * ldy + c], x[r * ldx + c]) << r << "," << c;
  // Fewer columns than the destination's stride leave the rest of each row alone.
  FVec z(rows * ldy, 5.0f);
  copy_rows(host(x), ldx, host(z), ldy, rows, 4);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < ldy; ++c)
      ASSERT_EQ(z[r * ldy + c], c < 4 ? x[r * ldx + c] : 5.0f) << r << "," << c;
}

// ---- normalisation -----------------------------------------------------------------------

constexpr float kEps = 1e-5f;

DVec rmsnorm_ref(const DVec& x, const DVec& w, int64_t N, int64_t C, DVec* rstd = nullptr) {
  DVec y(x.size());
  if (rstd) rstd->assign(N, 0);
  for (int64_t r = 0; r < N; ++r) {
    double ms = 0;
    for (int64_t c = 0; c < C; ++c) ms += x[r * C + c] * x[r * C + c];
    const double s = 1.0 / std::sqrt(ms / double(C) + kEps);
    if (rstd) (*rstd)[r] = s;
    for (int64_t c = 0; c < C; ++c) y[r * C + c] = x[r * C + c] * s * w[c];
  }
  return y;
}

DVec layernorm_ref(const DVec& x, const DVec& w, const DVec& b, int64_t N, int64_t C,
                   DVec* mean = nullptr, DVec* rstd = nullptr) {
  DVec y(x.size());
  if (mean) mean->assign(N, 0);
  if (rstd) rstd->assign(N, 0);
  for (int64_t r = 0; r < N; ++r) {
    double m = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) m += x[r * C + c];
    m /= double(C);
    for (int64_t c = 0; c < C; ++c) var += (x[r * C + c] - m) * (x[r * C + c] - m);
    var /= double(C);  // biased, as torch.nn.LayerNorm
    const double s = 1.0 / std::sqrt(var + kEps);
    if (mean) (*mean)[r] = m;
    if (rstd) (*rstd)[r] = s;
    for (int64_t c = 0; c < C; ++c) y[r * C + c] = (x[r * C + c] - m) * s * w[c] + b[c];
  }
  return y;
}

TEST(KokkosNorm, RmsnormForwardAndBackward) {
  const int64_t N = 6, C = 37;
  const FVec x = randn(N * C, 11, 1.5), w = randn(C, 12, 0.5, 1.0), dy = randn(N * C, 13);
  FVec y(N * C, kNaN), rstd(N, kNaN);
  rmsnorm_forward(host(x), host(w), host(y), host(rstd), N, C, kEps);
  DVec rstd_ref;
  const DVec xd = to_double(x), wd = to_double(w), dyd = to_double(dy);
  expect_close(y, rmsnorm_ref(xd, wd, N, C, &rstd_ref), kRel, -1, "rmsnorm y");
  expect_close(rstd, rstd_ref, kRel, 0, "rmsnorm rstd");

  FVec dx(N * C, kNaN), dw(C, 0.25f);  // dx overwritten, dw accumulated
  rmsnorm_backward(host(dy), host(x), host(w), host(rstd), host(dx), host(dw), N, C);
  const DVec dx_ref =
      numeric_vjp([&](const DVec& xx) { return rmsnorm_ref(xx, wd, N, C); }, xd, dyd);
  DVec dw_ref = numeric_vjp([&](const DVec& ww) { return rmsnorm_ref(xd, ww, N, C); }, wd, dyd);
  for (double& v : dw_ref) v += 0.25;
  expect_close(dx, dx_ref, kRel, -1, "rmsnorm dx");
  expect_close(dw, dw_ref, kRel, -1, "rmsnorm dw");
}

TEST(KokkosNorm, LayernormForwardAndBackward) {
  const int64_t N = 6, C = 37;
  // A common offset per row: the variance must not be computed as E[x^2] - E[x]^2 in fp32.
  const FVec x = randn(N * C, 21, 1.5, 10.0), w = randn(C, 22, 0.5, 1.0), b = randn(C, 23);
  const FVec dy = randn(N * C, 24);
  FVec y(N * C, kNaN), mean(N, kNaN), rstd(N, kNaN);
  layernorm_forward(host(x), host(w), host(b), host(y), host(mean), host(rstd), N, C, kEps);
  DVec mean_ref, rstd_ref;
  const DVec xd = to_double(x), wd = to_double(w), bd = to_double(b), dyd = to_double(dy);
  expect_close(y, layernorm_ref(xd, wd, bd, N, C, &mean_ref, &rstd_ref), kRel, -1, "layernorm y");
  expect_close(mean, mean_ref, kRel, 0, "layernorm mean");
  expect_close(rstd, rstd_ref, kRel, 0, "layernorm rstd");

  FVec dx(N * C, kNaN), dw(C, 0.25f), db(C, -0.5f);
  layernorm_backward(host(dy), host(x), host(w), host(mean), host(rstd), host(dx), host(dw),
                     host(db), N, C);
  const DVec dx_ref =
      numeric_vjp([&](const DVec& xx) { return layernorm_ref(xx, wd, bd, N, C); }, xd, dyd);
  DVec dw_ref =
      numeric_vjp([&](const DVec& ww) { return layernorm_ref(xd, ww, bd, N, C); }, wd, dyd);
  DVec db_ref =
      numeric_vjp([&](const DVec& bb) { return layernorm_ref(xd, wd, bb, N, C); }, bd, dyd);
  for (double& v : dw_ref) v += 0.25;
  for (double& v : db_ref) v -= 0.5;
  // dx is a difference of terms of size ~|x - mean| * rstd; with the offset of 10, fp32 x
  // itself carries a relative 6e-8 error of the offset, hence a slightly looser atol.
  expect_close(dx, dx_ref, kRel, 3 * kRel * max_abs(dx_ref), "layernorm dx");
  expect_close(dw, dw_ref, kRel, -1, "layernorm dw");
  expect_close(db, db_ref, kRel, -1, "layernorm db");
}

// ---- activations -------------------------------------------------------------------------

// Normal values plus the extremes where exp/tanh saturate.
FVec activation_inputs() {
  FVec x = randn(200, 31, 2.0);
  for (float v :
       {0.0f, -0.0f, 1e-6f, -1e-6f, 5.0f, -5.0f, 15.0f, -15.0f, 40.0f, -40.0f, 100.0f, -100.0f})
    x.push_back(v);
  return x;
}

double silu(double g) {
  return g / (1.0 + std::exp(-g));
}
double gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
// Elementwise derivative by central differences in double.
double derivative(double (*f)(double), double x) {
  const double h = 1e-6 * std::max(1.0, std::abs(x));
  return (f(x + h) - f(x - h)) / (2 * h);
}

TEST(KokkosActivation, SwigluForwardAndBackward) {
  const FVec gate = activation_inputs();
  const int64_t n = int64_t(gate.size());
  const FVec up = randn(n, 32), dout = randn(n, 33);
  FVec out(n, kNaN), dgate(n, kNaN), dup(n, kNaN);
  swiglu_forward(host(gate), host(up), host(out), n);
  swiglu_backward(host(dout), host(gate), host(up), host(dgate), host(dup), n);
  DVec out_ref(n), dgate_ref(n), dup_ref(n);
  for (int64_t i = 0; i < n; ++i) {
    out_ref[i] = silu(gate[i]) * up[i];
    dup_ref[i] = dout[i] * silu(gate[i]);
    dgate_ref[i] = dout[i] * up[i] * derivative(silu, gate[i]);
  }
  expect_close(out, out_ref, kRel, 1e-30, "swiglu out");
  expect_close(dup, dup_ref, kRel, 1e-30, "swiglu dup");
  // The numeric derivative itself is good to ~1e-9.
  expect_close(dgate, dgate_ref, kRel, 1e-8, "swiglu dgate");
}

TEST(KokkosActivation, GeluTanhForwardAndBackward) {
  const FVec x = activation_inputs();
  const int64_t n = int64_t(x.size());
  const FVec dy = randn(n, 34);
  FVec y(n, kNaN), dx(n, kNaN);
  gelu_forward(host(x), host(y), n);
  gelu_backward(host(dy), host(x), host(dx), n);
  DVec y_ref(n), dx_ref(n);
  for (int64_t i = 0; i < n; ++i) {
    y_ref[i] = gelu(x[i]);
    dx_ref[i] = dy[i] * derivative(gelu, x[i]);
  }
  // gelu(x) ~ 0 for x << 0 and the tanh is evaluated in fp32: absolute error ~1e-7 there.
  expect_close(y, y_ref, kRel, 1e-6, "gelu y");
  expect_close(dx, dx_ref, kRel, 1e-6, "gelu dx");
  // Spot values of the formula (torch.nn.functional.gelu(x, approximate='tanh')).
  const FVec xs = {1.0f, -1.0f, 3.0f};
  FVec ys(3);
  gelu_forward(host(xs), host(ys), 3);
  EXPECT_NEAR(ys[0], 0.8411919906082768, 1e-6);
  EXPECT_NEAR(ys[1], -0.15880800939172324, 1e-6);
  EXPECT_NEAR(ys[2], 2.996362607918227, 1e-6);
}

// ---- RoPE --------------------------------------------------------------------------------

// x[B,T,H,D], pairs (2j, 2j+1) rotated by angle (pos0 + t) * theta^(-2j/D).
DVec rope_ref(const FVec& x, int64_t B, int64_t T, int64_t H, int64_t D, int64_t pos0,
              double theta) {
  DVec y(x.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t j = 0; j < D / 2; ++j) {
          const int64_t i = ((b * T + t) * H + h) * D + 2 * j;
          const double angle = double(pos0 + t) * std::pow(theta, -2.0 * double(j) / double(D));
          const double c = std::cos(angle), s = std::sin(angle);
          y[i] = x[i] * c - x[i + 1] * s;
          y[i + 1] = x[i] * s + x[i + 1] * c;
        }
  return y;
}

TEST(KokkosRope, MatchesTheLlamaRotation) {
  const int64_t B = 2, T = 7, H = 3, D = 8;
  for (double theta : {10000.0, 50.0}) {
    const FVec x0 = randn(B * T * H * D, 41);
    FVec x = x0;
    rope(host(x), B, T, H, D, 0, float(theta), false);
    expect_close(x, rope_ref(x0, B, T, H, D, 0, theta), kRel, -1,
                 "rope theta=" + std::to_string(theta));
    // Position 0 is the identity; pair j = 0 at position 1 turns by exactly 1 radian.
    for (int64_t i = 0; i < H * D; ++i) EXPECT_EQ(x[i], x0[i]);
    const int64_t p = H * D;  // b = 0, t = 1, h = 0
    EXPECT_NEAR(x[p], x0[p] * std::cos(1.0) - x0[p + 1] * std::sin(1.0), 1e-6);
  }
}

TEST(KokkosRope, InverseUndoesForwardAndIsTheTranspose) {
  const int64_t B = 2, T = 9, H = 2, D = 6;
  const FVec x0 = randn(B * T * H * D, 42), g = randn(B * T * H * D, 43);
  FVec x = x0;
  rope(host(x), B, T, H, D, 0, 10000.0f, false);
  rope(host(x), B, T, H, D, 0, 10000.0f, true);
  expect_close(x, to_double(x0), kRel, -1, "rope^-1 rope x");
  // <R x, g> == <x, R^T g>: the inverse is the backward of the forward.
  FVec rx = x0, rtg = g;
  rope(host(rx), B, T, H, D, 0, 10000.0f, false);
  rope(host(rtg), B, T, H, D, 0, 10000.0f, true);
  double lhs = 0, rhs = 0, mag = 0;
  for (size_t i = 0; i < x0.size(); ++i) {
    lhs += double(rx[i]) * g[i];
    rhs += double(x0[i]) * rtg[i];
    mag += std::abs(double(x0[i]) * g[i]);
  }
  EXPECT_NEAR(lhs, rhs, kRel * mag);
}

TEST(KokkosRope, PositionOffset) {
  // Rotating tokens [pos0, pos0 + T) equals the tail of rotating [0, pos0 + T).
  const int64_t B = 2, T = 4, H = 2, D = 8, pos0 = 5, Tfull = pos0 + T;
  const FVec full0 = randn(B * Tfull * H * D, 44);
  FVec full = full0, tail;
  for (int64_t b = 0; b < B; ++b)
    tail.insert(tail.end(), full0.begin() + (b * Tfull + pos0) * H * D,
                full0.begin() + (b * Tfull + Tfull) * H * D);
  const FVec tail0 = tail;
  rope(host(full), B, Tfull, H, D, 0, 10000.0f, false);
  rope(host(tail), B, T, H, D, pos0, 10000.0f, false);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T * H * D; ++i)
      ASSERT_NEAR(tail[b * T * H * D + i], full[(b * Tfull + pos0) * H * D + i], 1e-6)
          << "b " << b << " i " << i;
  expect_close(tail, rope_ref(tail0, B, T, H, D, pos0, 10000.0), kRel, -1, "rope pos0");
}

// ---- embedding ---------------------------------------------------------------------------

TEST(KokkosEmbedding, ForwardGathersRows) {
  const int64_t V = 10, C = 37, N = 8;
  const FVec table = randn(V * C, 51);
  const std::vector<int32_t> ids = {3, 0, 9, 3, 3, 7, 0, 1};
  FVec out(N * C, kNaN);
  embedding_forward(host(ids), host(table), host(out), N, C);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) ASSERT_EQ(out[n * C + c], table[ids[n] * C + c]);
}

TEST(KokkosEmbedding, BackwardScatterAddsRepeatedIds) {
  const int64_t V = 10, C = 37, N = 8;  // C: two full blocks of 16 columns and a partial one
  const std::vector<int32_t> ids = {3, 0, 9, 3, 3, 7, 0, 1};
  const FVec dout = randn(N * C, 52);
  FVec dtable = randn(V * C, 53);
  DVec want = to_double(dtable);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) want[ids[n] * C + c] += dout[n * C + c];
  embedding_backward(host(ids), host(dout), host(dtable), N, C);
  expect_close(dtable, want, kRel, -1, "dtable");
  // Rows never looked up are untouched.
  const FVec before = randn(V * C, 53);
  for (int64_t v : {2, 4, 5, 6, 8})
    for (int64_t c = 0; c < C; ++c) ASSERT_EQ(dtable[v * C + c], before[v * C + c]);
}

}  // namespace
}  // namespace tessera::kernels
