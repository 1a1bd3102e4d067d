// Context parallelism's split of a sequence (ContextParallel::segments, ModelConfig::
// position_of, ModelConfig::split): which tokens a rank holds, in which order, at which global
// positions, that the ring's zigzag gives every rank the same causal work, and the errors.
#include <gtest/gtest.h>

#include <set>

#include "core/error.hpp"
#include "model/config.hpp"

namespace tessera {
namespace {

ModelConfig model(int64_t seq_len, int64_t heads = 4, int64_t kv_heads = 2) {
  ModelConfig c;
  c.seq_len = seq_len, c.heads = heads, c.kv_heads = kv_heads, c.head_dim = 16;
  return c;
}

TEST(ContextParallel, RingHoldsAHeadAndATailChunk) {
  const ContextParallel cp{4, 1, CpKind::ring};
  const auto s = cp.segments(32);  // 8 chunks of 4
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].pos0, 4);
  EXPECT_EQ(s[0].len, 4);
  EXPECT_EQ(s[1].pos0, 24);  // chunk 2 x 4 - 1 - 1 = 6
  EXPECT_EQ(s[1].len, 4);
}

TEST(ContextParallel, UlyssesHoldsOneContiguousChunk) {
  const ContextParallel cp{4, 3, CpKind::ulysses};
  const auto s = cp.segments(32);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].pos0, 24);
  EXPECT_EQ(s[0].len, 8);
}

TEST(ContextParallel, RanksCoverEverySequencePositionOnce) {
  for (CpKind kind : {CpKind::ring, CpKind::ulysses})
    for (int64_t n : {1, 2, 4, 8}) {
      std::multiset<int64_t> seen;
      for (int64_t r = 0; r < n; ++r)
        for (const auto& g : ContextParallel{n, r, kind}.segments(64))
          for (int64_t t = 0; t < g.len; ++t) seen.insert(g.pos0 + t);
      ASSERT_EQ(seen.size(), 64u);
      for (int64_t p = 0; p < 64; ++p) EXPECT_EQ(seen.count(p), 1u) << p;
    }
}

TEST(ContextParallel, ZigzagGivesEveryRankTheSameCausalWork) {
  // Causal (query, key) pairs whose query a rank holds: equal over ranks with the zigzag,
  // while a contiguous split gives the last rank (2n - 1) times the first's.
  const int64_t T = 64;
  for (int64_t n : {2, 4, 8}) {
    std::set<int64_t> work;
    for (int64_t r = 0; r < n; ++r) {
      int64_t pairs = 0;
      for (const auto& g : ContextParallel{n, r, CpKind::ring}.segments(T))
        for (int64_t t = 0; t < g.len; ++t) pairs += g.pos0 + t + 1;
      work.insert(pairs);
    }
    EXPECT_EQ(work.size(), 1u) << "cp " << n;
  }
}

TEST(ContextParallel, PositionsFollowTheSegmentMajorLayout) {
  ModelConfig c = model(16);
  c.split(ContextParallel{2, 0, CpKind::ring});  // chunks 0 and 3 of 4 tokens
  EXPECT_EQ(c.seq_local(), 8);
  const int64_t B = 3;  // rows: [chunk 0: 3 sequences x 4][chunk 3: 3 sequences x 4]
  EXPECT_EQ(c.position_of(0, B), 0);
  EXPECT_EQ(c.position_of(5, B), 1);    // sequence 1, token 1 of chunk 0
  EXPECT_EQ(c.position_of(12, B), 12);  // sequence 0, token 0 of chunk 3
  EXPECT_EQ(c.position_of(23, B), 15);
}

TEST(ContextParallel, SplitNamesWhatDoesNotDivide) {
  auto message = [](ModelConfig c, ContextParallel cp) {
    try {
      c.split(cp);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(model(36), {4, 0, CpKind::ring}).find("2 x cp = 8 zigzag chunks"),
            std::string::npos);
  EXPECT_EQ(message(model(40), {4, 0, CpKind::ring}), "");
  EXPECT_NE(message(model(30), {4, 0, CpKind::ulysses}).find("does not divide model.seq_len = 30"),
            std::string::npos);
  EXPECT_NE(message(model(32, 2, 2), {4, 0, CpKind::ulysses}).find("heads per tensor-parallel"),
            std::string::npos);
  EXPECT_NE(message(model(32, 4, 2), {4, 0, CpKind::ulysses}).find("key/value heads per"),
            std::string::npos);
  EXPECT_EQ(message(model(32, 4, 4), {4, 0, CpKind::ulysses}), "");
}

}  // namespace
}  // namespace tessera
