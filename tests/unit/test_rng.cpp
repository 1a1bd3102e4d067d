// The counter-based generator (core/rng.hpp) and the parameter initialisation built on it:
// Philox-4x32-10 known answers, the statistics and independence of the streams, and that a
// parameter's initial values depend only on (seed, name, element index).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "core/rng.hpp"
#include "model/param.hpp"
#include "tensor/tensor.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace tessera {
namespace {

// ---- Philox-4x32-10 ------------------------------------------------------------------------

// Known-answer vectors of Random123's kat_vectors file (philox4x32, 10 rounds).
TEST(Philox, Random123KnownAnswers) {
  struct Kat {
    Philox4x32 counter;
    std::array<uint32_t, 2> key;
    Philox4x32 expected;
  };
  const Kat kats[] = {
      {{0u, 0u, 0u, 0u}, {0u, 0u}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       {0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Kat& k : kats) {
    const Philox4x32 got = philox(k.counter, k.key);
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(got[i], k.expected[i]) << std::hex << "word " << i << " of counter " << k.counter[0]
                                       << ": 0x" << got[i] << " != 0x" << k.expected[i];
  }
}

TEST(Philox, HashNameSeparatesParameterNames) {
  EXPECT_EQ(hash_name("layers.0.attn.q.weight"), hash_name("layers.0.attn.q.weight"));
  EXPECT_NE(hash_name("layers.0.attn.q.weight"), hash_name("layers.0.attn.k.weight"));
  EXPECT_NE(hash_name("layers.1.mlp.up.weight"), hash_name("layers.11.mlp.up.weight"));
  EXPECT_NE(hash_name("ab"), hash_name("ba"));
}

// rng.hpp calls hash_name "64-bit FNV-1a", but rng.cpp's offset basis 1469598103934665603
// is FNV's 14695981039346656037 with its last digit dropped, so the values differ from
// FNV-1a (the published test values below). Changing the constant changes every initial
// weight, so whether to fix the code or the comment is the owner's call; enable this test
// if the code is fixed.
TEST(Philox, HashNameIsFnv1a64) {
  EXPECT_EQ(hash_name(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(hash_name("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(hash_name("foobar"), 0x85944171f73967e8ull);
}

// ---- CounterRng ----------------------------------------------------------------------------

TEST(CounterRng, NormalMomentsOver1e5Draws) {
  const CounterRng rng(1234, "layers.0.attn.q.weight");
  const int n = 100000;
  double s1 = 0, s2 = 0, s3 = 0, s4 = 0;
  int within1 = 0;
  for (int i = 0; i < n; ++i) {
    const double x = rng.normal(uint64_t(i));
    ASSERT_TRUE(std::isfinite(x)) << i;
    s1 += x, s2 += x * x, s3 += x * x * x, s4 += x * x * x * x;
    within1 += std::abs(x) < 1.0;
  }
  const double mean = s1 / n, var = s2 / n - mean * mean;
  // Bounds of about 5 standard errors: sd(mean) = 1/sqrt(n) = 0.0032, sd(var) = sqrt(2/n) =
  // 0.0045, sd(skew) = sqrt(6/n) = 0.0077, sd(kurtosis) = sqrt(24/n) = 0.015.
  EXPECT_NEAR(mean, 0.0, 0.016);
  EXPECT_NEAR(var, 1.0, 0.023);
  EXPECT_NEAR(s3 / n, 0.0, 0.04);
  EXPECT_NEAR(s4 / n, 3.0, 0.08);
  EXPECT_NEAR(double(within1) / n, 0.6826894921, 0.0075);  // sd 0.0015
}

TEST(CounterRng, UniformAndBits) {
  const CounterRng rng(7, "u");
  const int n = 100000;
  double s = 0;
  int low_bit = 0;
  for (int i = 0; i < n; ++i) {
    const double u = rng.uniform(uint64_t(i));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    s += u;
    low_bit += int(rng.bits(uint64_t(i)) & 1u);
  }
  EXPECT_NEAR(s / n, 0.5, 0.0046);  // 5 sd of 1/sqrt(12 n)
  EXPECT_NEAR(double(low_bit) / n, 0.5, 0.008);
}

TEST(CounterRng, ValuesDoNotDependOnDrawOrder) {
  const CounterRng rng(42, "embed.tok.weight");
  const int n = 4096;
  std::vector<float> forward(n);
  for (int i = 0; i < n; ++i) forward[i] = rng.normal(uint64_t(i));
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(3));
  const CounterRng again(42, "embed.tok.weight");  // a second object of the same stream
  for (int i : order) ASSERT_EQ(again.normal(uint64_t(i)), forward[i]) << i;
  // Far indices (beyond 32 bits of counter) are valid and distinct too.
  EXPECT_NE(rng.normal(uint64_t(1) << 40), rng.normal((uint64_t(1) << 40) + 2));
}

// Pearson correlation of two equally long sequences.
double correlation(const std::vector<double>& a, const std::vector<double>& b) {
  const double n = double(a.size());
  const double ma = std::accumulate(a.begin(), a.end(), 0.0) / n;
  const double mb = std::accumulate(b.begin(), b.end(), 0.0) / n;
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    sab += (a[i] - ma) * (b[i] - mb);
    saa += (a[i] - ma) * (a[i] - ma);
    sbb += (b[i] - mb) * (b[i] - mb);
  }
  return sab / std::sqrt(saa * sbb);
}

TEST(CounterRng, DifferentNamesAndSeedsGiveDifferentStreams) {
  const int n = 20000;
  const CounterRng a(1, "layers.0.mlp.up.weight"), b(1, "layers.0.mlp.gate.weight"),
      c(2, "layers.0.mlp.up.weight"), a2(1, "layers.1.mlp.up.weight");
  std::vector<double> va(n), vb(n), vc(n), va2(n), even(n / 2), odd(n / 2);
  int equal = 0;
  for (int i = 0; i < n; ++i) {
    va[i] = a.normal(uint64_t(i));
    vb[i] = b.normal(uint64_t(i));
    vc[i] = c.normal(uint64_t(i));
    va2[i] = a2.normal(uint64_t(i));
    equal += (va[i] == vb[i]) + (va[i] == vc[i]) + (va[i] == va2[i]);
  }
  EXPECT_EQ(equal, 0);
  // Uncorrelated: 5 standard errors of a correlation are 5/sqrt(n) = 0.035.
  EXPECT_LT(std::abs(correlation(va, vb)), 0.035);
  EXPECT_LT(std::abs(correlation(va, vc)), 0.035);
  EXPECT_LT(std::abs(correlation(va, va2)), 0.035);
  // The two normals of one Philox call (elements 2j and 2j+1) are uncorrelated as well.
  for (int j = 0; j < n / 2; ++j) even[j] = va[2 * j], odd[j] = va[2 * j + 1];
  EXPECT_LT(std::abs(correlation(even, odd)), 0.05);
  // Neighbouring elements of one stream are uncorrelated.
  std::vector<double> shifted(va.begin() + 1, va.end()), head(va.begin(), va.end() - 1);
  EXPECT_LT(std::abs(correlation(head, shifted)), 0.035);
}

// ---- ParamStore::initialize ----------------------------------------------------------------

struct Store {
  Allocator alloc;
  ParamStore params;
};

TEST(ParamInitialize, ValuesArePureFunctionsOfSeedNameAndIndex) {
  const Shape shape{6, 5};
  const ParamInit init{ParamInit::normal, 0.5f};
  // Alone in its store, and registered after other parameters of various sizes.
  Store alone, crowded;
  Param& p1 = alone.params.add("layers.1.attn.q.weight", shape, init, true);
  crowded.params.add("embed.tok.weight", Shape{7, 3}, init, false);
  crowded.params.add("layers.0.attn_norm.weight", Shape{5}, {ParamInit::ones}, false);
  crowded.params.add("odd", Shape{3}, init, false);
  Param& p2 = crowded.params.add("layers.1.attn.q.weight", shape, init, true);
  crowded.params.add("after", Shape{9}, init, false);
  alone.params.finalize(alone.alloc);
  crowded.params.finalize(crowded.alloc);
  ASSERT_NE(p1.offset, p2.offset);
  alone.params.initialize(99);
  crowded.params.initialize(99);
  const CounterRng rng(99, "layers.1.attn.q.weight");
  for (int64_t i = 0; i < shape.numel(); ++i) {
    ASSERT_EQ(p1.value.f32()[i], p2.value.f32()[i]) << i;
    ASSERT_EQ(p1.value.f32()[i], 0.5f * rng.normal(uint64_t(i))) << i;
  }
  const Param* norm = crowded.params.find("layers.0.attn_norm.weight");
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(norm->value.f32()[i], 1.0f);
  // Another seed gives other values.
  alone.params.initialize(100);
  int same = 0;
  for (int64_t i = 0; i < shape.numel(); ++i) same += p1.value.f32()[i] == p2.value.f32()[i];
  EXPECT_EQ(same, 0);
}

TEST(ParamInitialize, SameValuesForAnyThreadCount) {
#ifdef _OPENMP
  const int saved = omp_get_max_threads();
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    Store s;
    Param& p = s.params.add("w", Shape{33, 7}, {ParamInit::normal, 0.02f}, true);
    s.params.finalize(s.alloc);
    s.params.initialize(5);
    results.emplace_back(p.value.f32(), p.value.f32() + p.global.numel());
  }
  omp_set_num_threads(saved);
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
#else
  GTEST_SKIP() << "built without OpenMP";
#endif
}

TEST(ParamInitialize, PaddingRowsAreZero) {
  Store s;
  const int64_t rows = 8, valid = 5, C = 6;
  Param& p =
      s.params.add("embed.tok.weight", Shape{rows, C}, {ParamInit::normal, 1.0f, valid}, false);
  Param& b = s.params.add("bias", Shape{4}, {ParamInit::zeros}, false);
  s.params.finalize(s.alloc);
  // Make the buffer dirty first: initialize must write every element.
  std::fill(s.params.values(), s.params.values() + s.params.numel(), 7.0f);
  s.params.initialize(3);
  const CounterRng rng(3, "embed.tok.weight");
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const float v = p.value.f32()[r * C + c];
      if (r < valid)
        ASSERT_EQ(v, rng.normal(uint64_t(r * C + c))) << r << "," << c;
      else
        ASSERT_EQ(v, 0.0f) << "padding row " << r;
    }
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(b.value.f32()[i], 0.0f);
  // Gradients start at zero and zero_grads clears them.
  for (int64_t i = 0; i < s.params.numel(); ++i) ASSERT_EQ(s.params.grads()[i], 0.0f);
  std::fill(s.params.grads(), s.params.grads() + s.params.numel(), 1.0f);
  s.params.zero_grads();
  for (int64_t i = 0; i < s.params.numel(); ++i) ASSERT_EQ(s.params.grads()[i], 0.0f);
}

}  // namespace
}  // namespace tessera
