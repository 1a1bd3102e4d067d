// The loss and the optimizer kernels against naive loops in double precision (the rest of
// kernels/kernels.hpp: test_kernels.cpp): the fused and the vocabulary-parallel cross-entropy,
// masked targets and 16-bit gradients, and AdamW against torch's update. fp32 results must
// agree to a relative ~1e-5.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
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

// ---- cross-entropy -----------------------------------------------------------------------

struct CeRef {
  DVec loss, grad;
};
CeRef cross_entropy_ref(const FVec& logits, const std::vector<int32_t>& targets, int64_t N,
                        int64_t V, int64_t V_valid, double grad_scale) {
  CeRef r{DVec(N), DVec(N * V, 0.0)};
  for (int64_t n = 0; n < N; ++n) {
    const float* row = logits.data() + n * V;
    if (targets[n] < 0) {  // masked (ignore_index): loss 0, gradient 0
      r.loss[n] = 0;
      continue;
    }
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t v = 0; v < V_valid; ++v) mx = std::max(mx, double(row[v]));
    double sum = 0;
    for (int64_t v = 0; v < V_valid; ++v) sum += std::exp(row[v] - mx);
    r.loss[n] = mx + std::log(sum) - row[targets[n]];
    for (int64_t v = 0; v < V_valid; ++v)
      r.grad[n * V + v] = grad_scale * (std::exp(row[v] - mx) / sum - (v == targets[n]));
  }
  return r;
}

void check_cross_entropy(const FVec& logits0, const std::vector<int32_t>& targets, int64_t N,
                         int64_t V, int64_t V_valid, float grad_scale, const std::string& what) {
  FVec logits = logits0, losses(N, kNaN);
  cross_entropy_fused(host(logits), host(targets), host(losses), N, V, V_valid, grad_scale);
  const CeRef ref = cross_entropy_ref(logits0, targets, N, V, V_valid, grad_scale);
  expect_close(losses, ref.loss, kRel, 1e-6, what + " loss");
  expect_close(logits, ref.grad, kRel, 1e-7, what + " grad");
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = V_valid; v < V; ++v)
      ASSERT_EQ(logits[n * V + v], 0.0f) << what << ": padding column " << v << " of row " << n;
}

TEST(KokkosCrossEntropy, LossAndGradient) {
  const int64_t N = 6, V = 11;
  const FVec logits = randn(N * V, 61, 2.0);
  const std::vector<int32_t> targets = {0, 10, 5, 5, 3, 7};
  check_cross_entropy(logits, targets, N, V, V, 1.0f, "unpadded");
  check_cross_entropy(logits, targets, N, V, V, 0.125f, "grad_scale");
  // Gradient rows of softmax - onehot sum to zero.
  FVec g = logits, losses(N);
  cross_entropy_fused(host(g), host(targets), host(losses), N, V, V, 1.0f);
  for (int64_t n = 0; n < N; ++n) {
    double s = 0;
    for (int64_t v = 0; v < V; ++v) s += g[n * V + v];
    EXPECT_NEAR(s, 0.0, 1e-6);
  }
}

TEST(KokkosCrossEntropy, PaddingColumnsDoNotChangeTheLoss) {
  const int64_t N = 5, V = 16, V_valid = 11;
  FVec logits = randn(N * V, 62, 2.0);
  const std::vector<int32_t> targets = {10, 0, 4, 4, 9};
  // Padding columns hold values that would dominate the softmax if they were counted.
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = V_valid; v < V; ++v) logits[n * V + v] = 50.0f + float(v);
  check_cross_entropy(logits, targets, N, V, V_valid, 0.5f, "padded");

  // The same loss as the unpadded rows on their own.
  FVec padded = logits, plain, lp(N), lu(N);
  for (int64_t n = 0; n < N; ++n)
    plain.insert(plain.end(), logits.begin() + n * V, logits.begin() + n * V + V_valid);
  cross_entropy_fused(host(padded), host(targets), host(lp), N, V, V_valid, 1.0f);
  cross_entropy_fused(host(plain), host(targets), host(lu), N, V_valid, V_valid, 1.0f);
  for (int64_t n = 0; n < N; ++n) {
    EXPECT_EQ(lp[n], lu[n]) << n;
    for (int64_t v = 0; v < V_valid; ++v) EXPECT_EQ(padded[n * V + v], plain[n * V_valid + v]);
  }
}

TEST(KokkosCrossEntropy, LargeLogitsAreStable) {
  const int64_t N = 4, V = 9;
  FVec logits = randn(N * V, 63, 3.0);
  // exp of these overflows fp32 (and fp64 for the last) unless the row maximum is subtracted.
  const float offsets[N] = {100.0f, -100.0f, 1000.0f, 1e4f};
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = 0; v < V; ++v) logits[n * V + v] += offsets[n];
  const std::vector<int32_t> targets = {1, 2, 8, 0};
  check_cross_entropy(logits, targets, N, V, V, 1.0f, "large");
  // A confident correct prediction has loss ~0, a confident wrong one a loss ~ the margin.
  FVec sharp = {0.0f, 200.0f, 0.0f, 0.0f, 200.0f, 0.0f}, loss(2);
  const std::vector<int32_t> t2 = {1, 0};
  cross_entropy_fused(host(sharp), host(t2), host(loss), 2, 3, 3, 1.0f);
  EXPECT_NEAR(loss[0], 0.0, 1e-6);
  EXPECT_NEAR(loss[1], 200.0, 1e-3);
  for (float v : sharp) EXPECT_TRUE(std::isfinite(v));
}

TEST(KokkosCrossEntropy, HalfGradientIsTheRoundedFp32Gradient) {
  // With a 16-bit dlogits the kernel writes what casting its fp32 gradient would give, and the
  // same losses; whole rows (fused) and one rank's columns (local_finish) alike.
  const int64_t N = 5, V = 37, V_valid = 33;
  const FVec logits = randn(N * V, 64, 3.0);
  const std::vector<int32_t> targets = {0, 32, 7, 7, 20};
  for (DType t : {DType::bf16, DType::f16}) {
    FVec g = logits, want_loss(N), got_loss(N), scratch = logits;
    std::vector<uint16_t> half(size_t(N * V), 0xffff);
    cross_entropy_fused(host(g), host(targets), host(want_loss), N, V, V_valid, 0.25f);
    cross_entropy_fused(host(scratch), host(targets), host(got_loss), N, V, V_valid, 0.25f,
                        view_of(half.data(), t, Shape{N, V}));
    EXPECT_EQ(got_loss, want_loss);
    for (int64_t i = 0; i < N * V; ++i)
      ASSERT_EQ(half[size_t(i)],
                t == DType::bf16 ? half::to_bf16(g[size_t(i)]) : half::to_f16(g[size_t(i)]))
          << dtype_name(t) << " element " << i;

    // The vocabulary-parallel last pass, given the sums of the whole rows.
    FVec mx(N), target(N), rows = logits, loss2(N);
    std::vector<double> sum(N);
    cross_entropy_local_max(host(rows), host(mx), N, V, V_valid);
    cross_entropy_local_exp(host(rows), host(targets), host(mx), view_of(sum.data(), Shape{N}),
                            host(target), N, V, V_valid, 0);
    FVec rows32 = rows;
    std::vector<uint16_t> half2(size_t(N * V), 0xffff);
    cross_entropy_local_finish(host(rows32), host(targets), view_of(sum.data(), Shape{N}),
                               host(target), host(loss2), N, V, V_valid, 0, 0.25f);
    cross_entropy_local_finish(host(rows), host(targets), view_of(sum.data(), Shape{N}),
                               host(target), host(loss2), N, V, V_valid, 0, 0.25f,
                               view_of(half2.data(), t, Shape{N, V}));
    for (int64_t i = 0; i < N * V; ++i)
      ASSERT_EQ(half2[size_t(i)], t == DType::bf16 ? half::to_bf16(rows32[size_t(i)])
                                                   : half::to_f16(rows32[size_t(i)]))
          << dtype_name(t) << " local element " << i;
  }
}

// A negative target is masked: its row's loss and gradient are 0 (doc/data.md, "Loss masks"),
// the other rows are unchanged; a plain loop in double is the reference.
TEST(KokkosCrossEntropy, MaskedTargetsHaveNoLossAndNoGradient) {
  const int64_t N = 7, V = 13, V_valid = 11;
  const FVec logits = randn(N * V, 65, 2.0);
  const std::vector<int32_t> targets = {3, -1, 10, -1, -1, 0, 7};
  check_cross_entropy(logits, targets, N, V, V_valid, 0.5f, "masked");
  FVec g = logits, losses(N, kNaN);
  cross_entropy_fused(host(g), host(targets), host(losses), N, V, V_valid, 0.5f);
  for (int64_t n : {1, 3, 4}) {
    EXPECT_EQ(losses[n], 0.0f) << n;
    for (int64_t v = 0; v < V; ++v) ASSERT_EQ(g[n * V + v], 0.0f) << n << "," << v;
  }
  // Every row masked: nothing to learn, every loss and gradient 0 (16-bit gradient too).
  const std::vector<int32_t> none(N, -1);
  check_cross_entropy(logits, none, N, V, V_valid, 1.0f, "all masked");
  FVec scratch = logits, loss2(N, kNaN);
  std::vector<uint16_t> half(size_t(N * V), 0xffff);
  cross_entropy_fused(host(scratch), host(none), host(loss2), N, V, V_valid, 1.0f,
                      view_of(half.data(), DType::bf16, Shape{N, V}));
  for (int64_t i = 0; i < N * V; ++i) ASSERT_EQ(half[size_t(i)], 0u) << i;
  for (float l : loss2) EXPECT_EQ(l, 0.0f);
}

// The vocabulary-parallel passes with masked targets, the columns split over `parts` emulated
// ranks (the all-reduces of OutputHead::parallel_cross_entropy done here by hand): the same
// losses and gradient as the reference loop in double.
TEST(KokkosCrossEntropy, VocabularyParallelMaskedMatchesReference) {
  const int64_t N = 6, parts = 3, Vl = 5, V_valid = 13;  // 15 columns, the last 2 padding
  const int64_t V = parts * Vl;
  const FVec logits = randn(N * V, 66, 2.0);
  const std::vector<int32_t> targets = {12, -1, 0, 6, -1, 9};
  const CeRef ref = cross_entropy_ref(logits, targets, N, V, V_valid, 0.25);
  std::vector<FVec> block(parts);
  FVec mx(N, -std::numeric_limits<float>::infinity()), target(N, 0.0f), loss(N, kNaN);
  std::vector<double> sum(N, 0.0);
  for (int64_t p = 0; p < parts; ++p) {
    for (int64_t n = 0; n < N; ++n)
      block[p].insert(block[p].end(), logits.begin() + n * V + p * Vl,
                      logits.begin() + n * V + (p + 1) * Vl);
    FVec m(N);
    cross_entropy_local_max(host(block[p]), host(m), N, Vl,
                            std::clamp<int64_t>(V_valid - p * Vl, 0, Vl));
    for (int64_t n = 0; n < N; ++n) mx[n] = std::max(mx[n], m[n]);
  }
  for (int64_t p = 0; p < parts; ++p) {
    FVec t(N);
    std::vector<double> s(N);
    cross_entropy_local_exp(host(block[p]), host(targets), host(mx), view_of(s.data(), Shape{N}),
                            host(t), N, Vl, std::clamp<int64_t>(V_valid - p * Vl, 0, Vl), p * Vl);
    for (int64_t n = 0; n < N; ++n) sum[n] += s[n], target[n] += t[n];
  }
  for (int64_t p = 0; p < parts; ++p) {
    cross_entropy_local_finish(host(block[p]), host(targets), view_of(sum.data(), Shape{N}),
                               host(target), host(loss), N, Vl,
                               std::clamp<int64_t>(V_valid - p * Vl, 0, Vl), p * Vl, 0.25f);
    FVec got(N * Vl);
    DVec want(N * Vl);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t v = 0; v < Vl; ++v) {
        got[n * Vl + v] = block[p][n * Vl + v];
        want[n * Vl + v] = ref.grad[n * V + p * Vl + v];
      }
    expect_close(got, want, kRel, 1e-7, "vocabulary block " + std::to_string(p) + " grad");
    expect_close(loss, ref.loss, kRel, 1e-6, "vocabulary-parallel loss");
  }
  for (int64_t n : {1, 4}) EXPECT_EQ(loss[n], 0.0f);
}

// The output head's vocabulary tiles (OutputHead::head_chunk_tiled): each rank's real columns
// in tiles of T (the last one narrower), the running statistics along them, the
// vocabulary-parallel combination done by hand (maximum, rescale, sums), the losses, then each
// tile's gradient in fp32 and bf16: the losses and the gradient of the reference loop in double,
// for the whole vocabulary on one rank and split over 3 ranks of which the last holds only
// padding. One row's logits grow along the row, so its maximum moves at every tile.
TEST(KokkosCrossEntropy, VocabularyTilesMatchReference) {
  const int64_t N = 7, V_valid = 23, T = 5;
  FVec logits = randn(N * 36, 67, 3.0);
  for (int64_t v = 0; v < 36; ++v) logits[2 * 36 + v] = 0.3f * float(v);  // row 2 grows
  const std::vector<int32_t> targets = {0, -1, 22, 4, 5, 14, -1};
  for (const int64_t parts : {1, 3}) {
    const int64_t Vl = parts == 1 ? 24 : 12, V = parts * Vl;
    FVec full(N * V);
    for (int64_t n = 0; n < N; ++n)
      std::copy_n(logits.begin() + n * 36, V, full.begin() + n * V);
    const CeRef ref = cross_entropy_ref(full, targets, N, V, V_valid, 0.25);
    // The columns [c, c + t) of part p as a [N, t] tile.
    const auto tile = [&](int64_t p, int64_t c, int64_t t) {
      FVec out(N * t);
      for (int64_t n = 0; n < N; ++n)
        std::copy_n(full.begin() + n * V + p * Vl + c, t, out.begin() + n * t);
      return out;
    };
    const auto valid = [&](int64_t p) { return std::clamp<int64_t>(V_valid - p * Vl, 0, Vl); };
    std::vector<FVec> mx(parts, FVec(N)), target(parts, FVec(N));
    std::vector<std::vector<double>> sum(parts, std::vector<double>(N));
    FVec gmax(N, -std::numeric_limits<float>::infinity());
    for (int64_t p = 0; p < parts; ++p) {
      if (valid(p) == 0) {
        FVec none;
        cross_entropy_tile_stats(host(none), host(targets), host(mx[p]),
                                 view_of(sum[p].data(), Shape{N}), host(target[p]), N, 0, p * Vl,
                                 true);
      }
      for (int64_t c = 0; c < valid(p); c += T) {
        const int64_t t = std::min(T, valid(p) - c);
        FVec l = tile(p, c, t);
        cross_entropy_tile_stats(host(l), host(targets), host(mx[p]),
                                 view_of(sum[p].data(), Shape{N}), host(target[p]), N, t,
                                 p * Vl + c, c == 0);
      }
      for (int64_t n = 0; n < N; ++n) gmax[n] = std::max(gmax[n], mx[p][n]);
    }
    FVec tsum(N, 0.0f), loss(N, kNaN);
    std::vector<double> ssum(N, 0.0);
    for (int64_t p = 0; p < parts; ++p) {
      if (parts > 1)
        cross_entropy_rescale(view_of(sum[p].data(), Shape{N}), host(mx[p]), host(gmax), N);
      for (int64_t n = 0; n < N; ++n) ssum[n] += sum[p][n], tsum[n] += target[p][n];
    }
    cross_entropy_tile_loss(host(targets), host(gmax), view_of(ssum.data(), Shape{N}),
                            host(tsum), host(loss), N);
    const std::string what = std::to_string(parts) + " part(s)";
    expect_close(loss, ref.loss, kRel, 1e-6, what + " loss");
    for (int64_t n : {1, 6}) EXPECT_EQ(loss[n], 0.0f) << what;
    for (int64_t p = 0; p < parts; ++p)
      for (int64_t c = 0; c < valid(p); c += T) {
        const int64_t t = std::min(T, valid(p) - c);
        FVec g = tile(p, c, t), scratch = g;
        std::vector<uint16_t> half(size_t(N * t), 0xffff);
        cross_entropy_tile_grad(host(g), host(targets), host(gmax),
                                view_of(ssum.data(), Shape{N}), N, t, p * Vl + c, 0.25f);
        cross_entropy_tile_grad(host(scratch), host(targets), host(gmax),
                                view_of(ssum.data(), Shape{N}), N, t, p * Vl + c, 0.25f,
                                view_of(half.data(), DType::bf16, Shape{N, t}));
        DVec want(N * t);
        for (int64_t n = 0; n < N; ++n)
          for (int64_t v = 0; v < t; ++v) want[n * t + v] = ref.grad[n * V + p * Vl + c + v];
        const std::string at = what + ", part " + std::to_string(p) + " tile " + std::to_string(c);
        expect_close(g, want, kRel, 1e-7, at + " grad");
        for (int64_t i = 0; i < N * t; ++i)
          ASSERT_EQ(half[size_t(i)], half::to_bf16(g[size_t(i)])) << at << " bf16 element " << i;
      }
  }
}

// ---- AdamW -------------------------------------------------------------------------------

TEST(KokkosAdamW, MatchesTorchOverThreeSteps) {
  const int64_t n = 1001;
  const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  FVec p = randn(n, 71), m(n, 0.0f), v(n, 0.0f);
  DVec P = to_double(p), M(n, 0.0), Vv(n, 0.0);
  for (int64_t step = 1; step <= 3; ++step) {
    FVec g = randn(n, 72 + uint32_t(step), 0.5);
    g[0] = 0.0f;   // zero gradient: only the decay moves p (at step 1)
    g[1] = 1e-6f;  // tiny gradient: eps matters
    g[2] = 1e3f;   // large gradient: the update is bounded by ~lr
    adamw(host(p), host(g), host(m), host(v), n,
          {float(lr), float(b1), float(b2), float(eps), float(wd), step});
    // torch.optim.AdamW (single tensor, amsgrad=False, maximize=False):
    //   p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    //   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
    // Each result is compared with an error bound relative to the size of the terms that
    // make it up (they may cancel).
    const double bc1 = 1 - std::pow(b1, double(step)), bc2 = 1 - std::pow(b2, double(step));
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double m_scale = b1 * std::abs(M[i]) + (1 - b1) * std::abs(g[i]);
      P[i] *= 1 - lr * wd;
      M[i] = b1 * M[i] + (1 - b1) * g[i];
      Vv[i] = b2 * Vv[i] + (1 - b2) * double(g[i]) * g[i];
      const double update = lr / bc1 * M[i] / (std::sqrt(Vv[i]) / std::sqrt(bc2) + eps);
      const double p_scale = std::abs(P[i]) + std::abs(update);
      P[i] -= update;
      const bool ok = std::abs(p[i] - P[i]) <= kRel * p_scale &&
                      std::abs(m[i] - M[i]) <= kRel * m_scale &&
                      std::abs(v[i] - Vv[i]) <= kRel * Vv[i];
      if (!ok && bad++ < 5)
        ADD_FAILURE() << "step " << step << " element " << i << ": p " << p[i] << " vs " << P[i]
                      << ", m " << m[i] << " vs " << M[i] << ", v " << v[i] << " vs " << Vv[i];
    }
  }
  // A constant large gradient moves p by lr per step (m_hat / sqrt(v_hat) = 1) after decay d:
  // p3 = p0 d^3 - lr (d^2 + d + 1).
  const double p0 = randn(n, 71)[2], d = 1 - lr * wd;
  EXPECT_NEAR(p[2], p0 * d * d * d - lr * (d * d + d + 1), 1e-6);
}

TEST(KokkosAdamW, GradScaleMultipliesTheGradient) {
  // grad_scale (fused clipping) is exactly a step on grad_scale * g.
  const int64_t n = 257;
  const float scale = 0.3f;
  const FVec p0 = randn(n, 81), g = randn(n, 82);
  FVec scaled_g(n);
  for (int64_t i = 0; i < n; ++i) scaled_g[i] = scale * g[i];
  FVec p1 = p0, m1(n, 0.0f), v1(n, 0.0f), p2 = p0, m2(n, 0.0f), v2(n, 0.0f);
  for (int64_t step = 1; step <= 2; ++step) {
    AdamWArgs a{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step};
    adamw(host(p2), host(scaled_g), host(m2), host(v2), n, a);
    a.grad_scale = scale;
    adamw(host(p1), host(g), host(m1), host(v1), n, a);
  }
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(m1, m2);
  EXPECT_EQ(v1, v2);
}

TEST(KokkosAdamW, WritesTheRoundedComputeCopyInTheSamePass) {
  // The fused refresh: p, m and v as without it, and the copy equal to casting the new p.
  const int64_t n = 4099;  // more than one host piece, and a ragged end
  const FVec p0 = randn(n, 83), g = randn(n, 84);
  for (DType t : {DType::bf16, DType::f16}) {
    FVec p1 = p0, m1(n, 0.0f), v1(n, 0.0f), p2 = p0, m2(n, 0.0f), v2(n, 0.0f);
    std::vector<uint16_t> copy(size_t(n), 0xffff);
    for (int64_t step = 1; step <= 2; ++step) {
      const AdamWArgs a{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.5f};
      adamw(host(p1), host(g), host(m1), host(v1), n, a);
      adamw(host(p2), host(g), host(m2), host(v2), n, a, view_of(copy.data(), t, Shape{n}));
    }
    EXPECT_EQ(p2, p1);
    EXPECT_EQ(m2, m1);
    EXPECT_EQ(v2, v1);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(copy[size_t(i)],
                t == DType::bf16 ? half::to_bf16(p1[size_t(i)]) : half::to_f16(p1[size_t(i)]))
          << dtype_name(t) << " element " << i;
  }
}

}  // namespace
}  // namespace tessera::kernels
