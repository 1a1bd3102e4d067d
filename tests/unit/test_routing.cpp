// The mixture-of-experts routing kernels (kernels::moe_*, kokkos/routing.cpp) against plain
// loops: the host loops model/moe.cpp ran before the kernels (selection, node limits, capacity,
// packed order: exactly, and the scores, weights and balancing terms bit for bit, the same
// expressions), and loops in double for the arithmetic (combine, its backward, the router's
// gradient; 1e-5 relative, the kernels' bar). Ties, capacity overflow and node limits are
// built into the inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../test_vectors.hpp"
#include "core/error.hpp"
#include "kernels/kernels.hpp"

namespace tessera::kernels {
namespace {

using test::FVec;
using test::host;
using test::randn;
using test::tied;
using DVec = std::vector<double>;
using IVec = std::vector<int32_t>;

constexpr double kRel = 1e-5;

void expect_bits(const FVec& got, const FVec& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
        << what << " [" << i << "]: " << got[i] << " vs " << want[i];
}
void expect_bits(const DVec& got, const DVec& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint64_t>(got[i]), std::bit_cast<uint64_t>(want[i]))
        << what << " [" << i << "]: " << got[i] << " vs " << want[i];
}
template <class V>
void expect_near(const V& got, const DVec& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(double(got[i]), want[i], kRel * std::abs(want[i]) + kRel * scale)
        << what << " [" << i << "]";
}
Tensor f64_view(const DVec& v) {
  return view_of(v.data(), Shape{int64_t(v.size())});
}


// ---- the host loops of model/moe.cpp before the kernels ----

void ref_scores(const FVec& l, FVec& s, DVec& lse, DVec& norm, int64_t N, int64_t E, bool sigmoid) {
  FVec p(static_cast<size_t>(E));
  for (int64_t n = 0; n < N; ++n) {
    const float* ln = l.data() + n * E;
    float mx = ln[0];
    for (int64_t e = 1; e < E; ++e) mx = std::max(mx, ln[e]);
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(double(ln[e] - mx));
    for (int64_t e = 0; e < E; ++e) p[size_t(e)] = float(std::exp(double(ln[e] - mx)) / sum);
    lse[size_t(n)] = double(mx) + std::log(sum);
    for (int64_t e = 0; e < E; ++e)
      s[size_t(n * E + e)] = sigmoid ? 1.0f / (1.0f + std::exp(-ln[e])) : p[size_t(e)];
    double t = 0;
    for (int64_t e = 0; e < E; ++e) t += s[size_t(n * E + e)];
    norm[size_t(n)] = t;
  }
}

void ref_top_k(const float* key, int32_t* out, int64_t E, int64_t K) {
  std::vector<char> taken(size_t(E), 0);
  for (int64_t j = 0; j < K; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e)
      if (!taken[size_t(e)] && (best < 0 || key[e] > key[size_t(best)])) best = e;
    if (best >= 0) taken[size_t(best)] = 1;
    out[j] = int32_t(best);
  }
}

void ref_limit_to_nodes(float* key, int64_t E, int64_t K, int64_t G, int64_t M) {
  const int64_t per = E / G, q = std::min((K + M - 1) / M, per);
  FVec score(static_cast<size_t>(G)), top(static_cast<size_t>(per));
  for (int64_t g = 0; g < G; ++g) {
    std::copy(key + g * per, key + (g + 1) * per, top.begin());
    std::partial_sort(top.begin(), top.begin() + q, top.end(), std::greater<float>());
    float sum = 0;
    for (int64_t i = 0; i < q; ++i) sum += top[size_t(i)];
    score[size_t(g)] = sum;
  }
  std::vector<char> keep(size_t(G), 0);
  for (int64_t m = 0; m < M; ++m) {
    int64_t best = -1;
    for (int64_t g = 0; g < G; ++g)
      if (!keep[size_t(g)] && (best < 0 || score[size_t(g)] > score[size_t(best)])) best = g;
    if (best >= 0) keep[size_t(best)] = 1;
  }
  for (int64_t e = 0; e < E; ++e)
    if (!keep[size_t(e / per)]) key[e] = -std::numeric_limits<float>::infinity();
}

void ref_select(const FVec& s, const FVec& bias, IVec& choice, FVec& w, int64_t N, int64_t E,
                int64_t K, int64_t G, int64_t M, bool normalise) {
  FVec key(static_cast<size_t>(E));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t e = 0; e < E; ++e) key[size_t(e)] = s[size_t(n * E + e)] + bias[size_t(e)];
    if (M > 0 && M < G) ref_limit_to_nodes(key.data(), E, K, G, M);
    ref_top_k(key.data(), choice.data() + n * K, E, K);
    double sum = 0;
    for (int64_t j = 0; j < K; ++j) {
      const float x = s[size_t(n * E + choice[size_t(n * K + j)])];
      w[size_t(n * K + j)] = x;
      sum += x;
    }
    if (normalise)
      for (int64_t j = 0; j < K; ++j)
        w[size_t(n * K + j)] = float(double(w[size_t(n * K + j)]) / sum);
  }
}

// Capacity, counts and packed rows: row, offset [E+1], load [B,E], dropped.
struct Packed {
  IVec row, offset, load;
  int64_t dropped = 0;
};
Packed ref_pack(const IVec& choice, int64_t B, int64_t T, int64_t K, int64_t E, int64_t cap,
                int64_t r0, int64_t R) {
  const int64_t N = B * T;
  Packed p;
  p.row.assign(size_t(N * K), -1), p.offset.assign(size_t(E + 1), 0);
  p.load.assign(size_t(B * E), 0);
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> used(size_t(E), 0);
    for (int64_t n = b * T; n < (b + 1) * T; ++n)
      for (int64_t j = 0; j < K; ++j) {
        const int32_t e = choice[size_t(n * K + j)];
        const bool keep = used[size_t(e)]++ < cap, own = n >= r0 && n < r0 + R;
        p.row[size_t(n * K + j)] = keep && own ? 0 : -1;
        if (keep && own) ++p.offset[size_t(e) + 1];
        if (!keep) ++p.dropped;
      }
    for (int64_t e = 0; e < E; ++e) p.load[size_t(b * E + e)] = int32_t(used[size_t(e)]);
  }
  for (int64_t e = 0; e < E; ++e) p.offset[size_t(e) + 1] += p.offset[size_t(e)];
  IVec fill(p.offset.begin(), p.offset.end() - 1);
  for (int64_t n = r0; n < r0 + R; ++n)
    for (int64_t j = 0; j < K; ++j)
      if (p.row[size_t(n * K + j)] == 0)
        p.row[size_t(n * K + j)] = fill[size_t(choice[size_t(n * K + j)])]++;
  return p;
}

// Random distinct choices per token, skewed towards the first experts (capacity overflows).
IVec random_choices(int64_t N, int64_t E, int64_t K, uint32_t seed) {
  std::mt19937 gen(seed);
  std::geometric_distribution<int> d(0.3);
  IVec c(size_t(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < K; ++j) {
      int32_t e;
      bool again;
      do {
        e = int32_t(d(gen) % E);
        again = std::find(c.begin() + n * K, c.begin() + n * K + j, e) != c.begin() + n * K + j;
      } while (again);
      c[size_t(n * K + j)] = e;
    }
  return c;
}

// ---- scores ----

TEST(MoeRouting, ScoresAreTheHostLoopsBits) {
  for (bool sigmoid : {false, true})
    for (auto [N, E] : {std::pair<int64_t, int64_t>{1, 1}, {37, 8}, {5, 67}}) {
      FVec l = randn(N * E, uint32_t(N * E), 3.0);
      l[0] = 90.0f;  // exp of large logits
      FVec s(size_t(N * E)), s_ref(s.size());
      DVec lse(static_cast<size_t>(N)), norm(static_cast<size_t>(N)), lse_ref(lse.size()),
          norm_ref(norm.size());
      moe_scores(host(l), host(s), f64_view(lse), f64_view(norm), N, E, sigmoid);
      ref_scores(l, s_ref, lse_ref, norm_ref, N, E, sigmoid);
      const std::string what = std::string(sigmoid ? "sigmoid" : "softmax") +
                               " N=" + std::to_string(N) + " E=" + std::to_string(E);
      expect_bits(s, s_ref, what + " scores");
      expect_bits(lse, lse_ref, what + " lse");
      expect_bits(norm, norm_ref, what + " norm");
      // And the functions themselves, in double.
      DVec want(s.size());
      for (int64_t n = 0; n < N; ++n) {
        double mx = l[size_t(n * E)], sum = 0;
        for (int64_t e = 0; e < E; ++e) mx = std::max(mx, double(l[size_t(n * E + e)]));
        for (int64_t e = 0; e < E; ++e) sum += std::exp(double(l[size_t(n * E + e)]) - mx);
        for (int64_t e = 0; e < E; ++e) {
          const double x = l[size_t(n * E + e)];
          want[size_t(n * E + e)] = sigmoid ? 1 / (1 + std::exp(-x)) : std::exp(x - mx) / sum;
        }
      }
      expect_near(s, want, what + " scores vs double");
    }
}

// ---- top-k ----

TEST(MoeRouting, TopKTiesGoToTheLowerExpert) {
  for (auto [E, K] : {std::pair<int64_t, int64_t>{8, 2}, {16, 5}, {7, 7}, {64, 6}}) {
    const int64_t N = 53;
    for (int levels : {2, 5, 1000}) {
      const FVec s = tied(N * E, uint32_t(E + levels), levels);
      const FVec bias = tied(E, uint32_t(K), 3);
      for (bool normalise : {false, true}) {
        IVec c(size_t(N * K)), c_ref(c.size());
        FVec w(c.size()), w_ref(c.size());
        moe_top_k(host(s), host(bias), host(c), host(w), N, E, K, 1, 0, normalise);
        ref_select(s, bias, c_ref, w_ref, N, E, K, 1, 0, normalise);
        const std::string what = "E=" + std::to_string(E) + " K=" + std::to_string(K) +
                                 " levels=" + std::to_string(levels);
        ASSERT_EQ(c, c_ref) << what;
        expect_bits(w, w_ref, what + " weights");
      }
    }
  }
  // All keys equal: experts 0..K-1 in order.
  const FVec same(16, 0.5f), zero(8, 0.0f);
  IVec c(6);
  moe_top_k(host(same), host(zero), host(c), Tensor{}, 2, 8, 3, 1, 0, false);
  EXPECT_EQ(c, (IVec{0, 1, 2, 0, 1, 2}));
}

TEST(MoeRouting, TopKNodeLimitedMatchesTheHostRule) {
  struct Case {
    int64_t E, K, G, M;
  };
  // q = ceil(K/M) below and at E/G, M = 1 .. G-1, ties between nodes.
  for (const Case& k : {Case{8, 2, 2, 1}, Case{8, 3, 4, 2}, Case{16, 4, 4, 2}, Case{12, 5, 3, 2},
                        Case{32, 8, 8, 3}, Case{6, 2, 6, 2}})
    for (int levels : {2, 4, 1000}) {
      const int64_t N = 41;
      const FVec s = tied(N * k.E, uint32_t(k.E * 31 + levels), levels);
      const FVec bias = randn(k.E, uint32_t(k.G), 0.05);
      IVec c(size_t(N * k.K)), c_ref(c.size());
      FVec w(c.size()), w_ref(c.size());
      moe_top_k(host(s), host(bias), host(c), host(w), N, k.E, k.K, k.G, k.M, true);
      ref_select(s, bias, c_ref, w_ref, N, k.E, k.K, k.G, k.M, true);
      const std::string what = "E=" + std::to_string(k.E) + " K=" + std::to_string(k.K) +
                               " G=" + std::to_string(k.G) + " M=" + std::to_string(k.M) +
                               " levels=" + std::to_string(levels);
      ASSERT_EQ(c, c_ref) << what;
      expect_bits(w, w_ref, what + " weights");
      // Every token's experts on at most M nodes.
      for (int64_t n = 0; n < N; ++n) {
        std::vector<int64_t> nodes;
        for (int64_t j = 0; j < k.K; ++j) nodes.push_back(c[size_t(n * k.K + j)] / (k.E / k.G));
        std::sort(nodes.begin(), nodes.end());
        EXPECT_LE(std::unique(nodes.begin(), nodes.end()) - nodes.begin(), k.M) << what;
      }
    }
  // M >= G is unrestricted routing.
  const FVec s = randn(10 * 8, 3), bias(8, 0.0f);
  IVec a(20), b(20);
  moe_top_k(host(s), host(bias), host(a), Tensor{}, 10, 8, 2, 2, 2, false);
  moe_top_k(host(s), host(bias), host(b), Tensor{}, 10, 8, 2, 1, 0, false);
  EXPECT_EQ(a, b);
}

// ---- capacity, packed order, balancing terms, statistics ----

TEST(MoeRouting, CapacityAndPackedOrderMatchTheHostLoops) {
  struct Case {
    int64_t B, T, E, K, cap, r0, R;
  };
  // Dropless; capacity overflowing (skewed choices); own rows a part of the tokens that starts
  // and ends inside sequences (a tensor-parallel rank's share); one expert.
  for (const Case& k :
       {Case{2, 16, 8, 2, 32, 0, 32}, Case{3, 20, 8, 2, 3, 0, 60}, Case{4, 9, 6, 3, 2, 7, 20},
        Case{1, 50, 16, 4, 1, 10, 30}, Case{2, 5, 1, 1, 2, 3, 5}}) {
    const int64_t N = k.B * k.T;
    const IVec choice = random_choices(N, k.E, k.K, uint32_t(N + k.cap));
    const Packed want = ref_pack(choice, k.B, k.T, k.K, k.E, k.cap, k.r0, k.R);
    IVec load(size_t(k.B * k.E)), kept(load.size()), row(size_t(N * k.K), 7);
    IVec offset(size_t(k.E + 1), 99);
    moe_capacity(host(choice), host(load), host(kept), host(row), k.B, k.T, k.K, k.E, k.cap, k.r0,
                 k.R);
    moe_pack(host(choice), host(kept), host(offset), host(row), k.B, k.T, k.K, k.E);
    const std::string what = "B=" + std::to_string(k.B) + " T=" + std::to_string(k.T) +
                             " E=" + std::to_string(k.E) + " cap=" + std::to_string(k.cap) +
                             " rows " + std::to_string(k.r0) + "+" + std::to_string(k.R);
    EXPECT_EQ(load, want.load) << what;
    EXPECT_EQ(offset, want.offset) << what;
    EXPECT_EQ(row, want.row) << what;
    // The statistics: load per expert, drops, and the off-node count of given choices.
    DVec lse = DVec(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) lse[size_t(n)] = 0.1 * double(n) - 1.3;
    DVec stats(size_t(k.E + 4));
    const int64_t lo = k.E / 4, hi = k.E / 2 + 1;
    moe_route_stats(f64_view(lse), host(load), Tensor{}, host(choice), f64_view(stats), k.B, k.T,
                    k.K, k.E, k.cap, 2.5, 0.75, k.r0, k.R, lo, hi);
    for (int64_t e = 0; e < k.E; ++e) {
      double sum = 0;
      for (int64_t b = 0; b < k.B; ++b) sum += want.load[size_t(b * k.E + e)];
      EXPECT_EQ(stats[size_t(e)], sum) << what << " load of " << e;
    }
    EXPECT_EQ(stats[size_t(k.E)], double(want.dropped)) << what;
    double z = 2.5;
    for (double x : lse) z += x * x;
    EXPECT_NEAR(stats[size_t(k.E + 1)], z, 1e-12 * z) << what;
    EXPECT_EQ(stats[size_t(k.E + 2)], 0.75) << what;  // no aux terms given
    int64_t off = 0;
    for (int64_t i = k.r0 * k.K; i < (k.r0 + k.R) * k.K; ++i)
      off += choice[size_t(i)] < lo || choice[size_t(i)] >= hi;
    EXPECT_EQ(stats[size_t(k.E + 3)], double(off)) << what;
  }
}

TEST(MoeRouting, BalancingTermsAreTheHostLoopsBits) {
  const int64_t B = 3, T = 17, E = 8, K = 2, N = B * T;
  for (bool sigmoid : {false, true}) {
    const FVec l = randn(N * E, 11, 2.0);
    FVec s(size_t(N * E));
    DVec lse(static_cast<size_t>(N)), norm(static_cast<size_t>(N));
    moe_scores(host(l), host(s), f64_view(lse), f64_view(norm), N, E, sigmoid);
    const IVec choice = random_choices(N, E, K, 5);
    const Packed p = ref_pack(choice, B, T, K, E, 4, 0, N);
    FVec f(size_t(B * E)), f_ref(f.size());
    DVec aux(f.size()), aux_ref(f.size());
    moe_balance(host(s), sigmoid ? f64_view(norm) : Tensor{}, host(p.load), host(f), f64_view(aux),
                B, T, K, E);
    // The host loop: P_e over the sequence of s_e / (sum of the token's scores) (softmax: 1),
    // the norm recomputed for every expert as it was.
    double aux_seq_sum = 0.25;
    for (int64_t b = 0; b < B; ++b) {
      double seq = 0;
      for (int64_t e = 0; e < E; ++e) {
        f_ref[size_t(b * E + e)] =
            float(double(E) / double(K * T) * double(p.load[size_t(b * E + e)]));
        double P = 0;
        for (int64_t n = b * T; n < (b + 1) * T; ++n) {
          double nrm = 1;
          if (sigmoid) {
            nrm = 0;
            for (int64_t i = 0; i < E; ++i) nrm += s[size_t(n * E + i)];
          }
          P += s[size_t(n * E + e)] / nrm;
        }
        aux_ref[size_t(b * E + e)] = f_ref[size_t(b * E + e)] * P / double(T);
        seq += f_ref[size_t(b * E + e)] * P / double(T);
      }
      aux_seq_sum += seq;
    }
    expect_bits(f, f_ref, "f");
    expect_bits(aux, aux_ref, "aux terms");
    DVec stats(size_t(E + 4));
    moe_route_stats(f64_view(lse), host(p.load), f64_view(aux), Tensor{}, f64_view(stats), B, T, K,
                    E, 4, 0.0, 0.25, 0, N, 0, E);
    EXPECT_EQ(std::bit_cast<uint64_t>(stats[size_t(E + 2)]), std::bit_cast<uint64_t>(aux_seq_sum));
    EXPECT_EQ(stats[size_t(E + 3)], 0.0);
  }
}

// ---- moving rows ----

TEST(MoeRouting, GatherCombineAndBackwardMatchLoops) {
  const int64_t B = 2, T = 13, E = 5, K = 2, N = B * T;
  for (int64_t C : {1, 19, 300}) {
    const IVec choice = random_choices(N, E, K, uint32_t(C));
    const int64_t r0 = 4, R = 17, y0 = 3;  // own rows [4, 21); y and dy start at token 3
    const Packed p = ref_pack(choice, B, T, K, E, 3, r0, R);  // with drops
    const FVec x = randn(N * C, 1), w = randn(N * K, 2), out = randn(N * K * C, 3);
    FVec packed(size_t(N * K * C), -5.0f);
    moe_gather(host(x), host(p.row), host(packed), r0, R, K, C);
    FVec packed_ref(packed.size(), -5.0f);
    for (int64_t n = r0; n < r0 + R; ++n)
      for (int64_t j = 0; j < K; ++j)
        if (const int32_t r = p.row[size_t(n * K + j)]; r >= 0)
          std::copy(x.begin() + n * C, x.begin() + (n + 1) * C, packed_ref.begin() + r * C);
    expect_bits(packed, packed_ref, "gather C=" + std::to_string(C));

    const int64_t Ny = N - y0;
    const FVec y0v = randn(Ny * C, 4);
    FVec y = y0v, ysum = y0v;
    moe_combine(host(out), host(p.row), host(w), host(y), r0, R, y0, K, C);
    moe_combine(host(out), host(p.row), Tensor{}, host(ysum), r0, R, y0, K, C);
    DVec y_ref(y0v.begin(), y0v.end()), ysum_ref(y_ref);
    for (int64_t n = r0; n < r0 + R; ++n)
      for (int64_t j = 0; j < K; ++j)
        if (const int32_t r = p.row[size_t(n * K + j)]; r >= 0)
          for (int64_t c = 0; c < C; ++c) {
            y_ref[size_t((n - y0) * C + c)] +=
                double(w[size_t(n * K + j)]) * out[size_t(r * C + c)];
            ysum_ref[size_t((n - y0) * C + c)] += double(out[size_t(r * C + c)]);
          }
    expect_near(y, y_ref, "combine C=" + std::to_string(C));
    expect_near(ysum, ysum_ref, "scatter C=" + std::to_string(C));

    const FVec dy = randn(Ny * C, 5);
    FVec d_packed(packed.size(), -7.0f), dw(size_t(N * K), -7.0f);
    moe_combine_backward(host(dy), host(out), host(p.row), host(w), host(d_packed), host(dw), r0, R,
                         y0, K, C);
    DVec dp_ref(d_packed.size(), -7.0), dw_ref(dw.size(), -7.0);
    for (int64_t n = r0; n < r0 + R; ++n)
      for (int64_t j = 0; j < K; ++j) {
        const int32_t r = p.row[size_t(n * K + j)];
        double dot = 0;
        if (r >= 0)
          for (int64_t c = 0; c < C; ++c) {
            dp_ref[size_t(r * C + c)] = double(w[size_t(n * K + j)]) * dy[size_t((n - y0) * C + c)];
            dot += double(dy[size_t((n - y0) * C + c)]) * out[size_t(r * C + c)];
          }
        dw_ref[size_t(n * K + j)] = dot;
      }
    expect_near(d_packed, dp_ref, "d_packed C=" + std::to_string(C));
    expect_near(dw, dw_ref, "dweight C=" + std::to_string(C));
  }
}

// ---- the router's backward ----

// d(objective)/d(logits) in double: the chain rule through the scores, as written out in
// doc/moe.md (combine weights, balancing loss per sequence, z-loss).
DVec ref_router_grad(const FVec& l, const FVec& s, const IVec& choice, const FVec& w,
                     const FVec& dw, const FVec& f, int64_t r0, int64_t R, int64_t T, int64_t E,
                     int64_t K, bool sigmoid, double aux, double zc) {
  DVec out(size_t(R * E));
  for (int64_t n = r0; n < r0 + R; ++n) {
    const float* sn = s.data() + n * E;
    DVec ds(size_t(E), 0.0);
    if (!sigmoid) {
      for (int64_t j = 0; j < K; ++j)
        ds[size_t(choice[size_t(n * K + j)])] += dw[size_t(n * K + j)];
    } else {
      double sum = 0, dot = 0;
      for (int64_t j = 0; j < K; ++j)
        sum += sn[choice[size_t(n * K + j)]],
            dot += double(dw[size_t(n * K + j)]) * w[size_t(n * K + j)];
      for (int64_t j = 0; j < K; ++j)
        ds[size_t(choice[size_t(n * K + j)])] += (double(dw[size_t(n * K + j)]) - dot) / sum;
    }
    const float* fb = f.data() + (n / T) * E;
    if (!sigmoid) {
      for (int64_t e = 0; e < E; ++e) ds[size_t(e)] += aux * fb[e];
    } else {
      double sum = 0, dot = 0;
      for (int64_t e = 0; e < E; ++e) sum += sn[e];
      for (int64_t e = 0; e < E; ++e) dot += aux * fb[e] * sn[e] / sum;
      for (int64_t e = 0; e < E; ++e) ds[size_t(e)] += (aux * fb[e] - dot) / sum;
    }
    double* dn = out.data() + (n - r0) * E;
    double dot = 0;
    for (int64_t e = 0; e < E; ++e) dot += ds[size_t(e)] * sn[e];
    for (int64_t e = 0; e < E; ++e)
      dn[e] = sigmoid ? ds[size_t(e)] * sn[e] * (1.0 - sn[e]) : sn[e] * (ds[size_t(e)] - dot);
    const float* ln = l.data() + n * E;
    double mx = ln[0], sum = 0;
    for (int64_t e = 0; e < E; ++e) mx = std::max(mx, double(ln[e]));
    for (int64_t e = 0; e < E; ++e) sum += std::exp(ln[e] - mx);
    const double z = mx + std::log(sum);
    for (int64_t e = 0; e < E; ++e) dn[e] += zc * z * std::exp(ln[e] - mx) / sum;
  }
  return out;
}

TEST(MoeRouting, RouterBackwardMatchesDoubleLoops) {
  const int64_t B = 2, T = 11, E = 8, K = 3, N = B * T, r0 = 5, R = 14;
  for (bool sigmoid : {false, true})
    for (double aux : {0.0, 0.02})
      for (double zc : {0.0, 0.004}) {
        const FVec l = randn(N * E, 21, 1.5);
        FVec s(size_t(N * E));
        DVec lse(static_cast<size_t>(N)), norm(static_cast<size_t>(N));
        moe_scores(host(l), host(s), f64_view(lse), f64_view(norm), N, E, sigmoid);
        const FVec bias(size_t(E), 0.0f);
        IVec choice(size_t(N * K));
        FVec w(size_t(N * K));
        moe_top_k(host(s), host(bias), host(choice), host(w), N, E, K, 1, 0, sigmoid);
        const FVec dw = randn(N * K, 22), f = randn(B * E, 23, 1.0, 1.0);
        FVec dl(size_t(R * E), -9.0f);
        moe_router_backward(host(l), host(s), host(choice), host(w), host(dw), host(f), host(dl),
                            r0, R, T, E, K, sigmoid, aux, zc);
        const DVec want = ref_router_grad(l, s, choice, w, dw, f, r0, R, T, E, K, sigmoid, aux, zc);
        expect_near(dl, want,
                    std::string(sigmoid ? "sigmoid" : "softmax") + " aux=" + std::to_string(aux) +
                        " z=" + std::to_string(zc));
      }
}

TEST(MoeRouting, ErrorsNameTheKernel) {
  const FVec s(16), bias(8);
  IVec c(4);
  try {
    moe_top_k(host(s), host(bias), host(c), Tensor{}, 2, 8, 9, 1, 0, false);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("moe_top_k"), std::string::npos) << e.what();
  }
  IVec c6(6);  // 4 nodes of 2 experts, 1 kept: 2 experts for 3 choices
  EXPECT_THROW(moe_top_k(host(s), host(bias), host(c6), Tensor{}, 2, 8, 3, 4, 1, false), Error);
  EXPECT_THROW(moe_top_k(host(s), host(bias), host(c), Tensor{}, 3, 8, 2, 1, 0, false), Error);
}

}  // namespace
}  // namespace tessera::kernels
