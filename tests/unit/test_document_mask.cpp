// Document masking in the attention kernels (kernels.hpp, doc_start) against the naive loops in
// double with the same mask, and the per-token RoPE (kernels::rope_at) against kernels::rope.
// Documents are given as their global start positions; a query row's doc_start is the start of
// the document it belongs to.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "../test_vectors.hpp"
#include "attention_naive.hpp"
#include "kernels/kernels.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace tessera::kernels {
namespace {

using naive::DVec;
using naive::Naive;
using naive::random_vec;
using naive::rel_err;
using naive::Shape;
using naive::to_float;
using test::host;

constexpr double kTol = 1e-5;
constexpr float kGarbage = std::numeric_limits<float>::quiet_NaN();

// [B, T] document starts: sequence b's documents start at starts[b % starts.size()] (each list
// begins with 0), every row gets the last start at or before it.
std::vector<int32_t> doc_starts(int64_t B, int64_t T,
                                const std::vector<std::vector<int32_t>>& starts) {
  std::vector<int32_t> doc(size_t(B * T));
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<int32_t>& s = starts[size_t(b) % starts.size()];
    size_t d = 0;
    for (int64_t i = 0; i < T; ++i) {
      while (d + 1 < s.size() && s[d + 1] <= i) ++d;
      doc[size_t(b * T + i)] = s[d];
    }
  }
  return doc;
}

struct Case {
  Shape shape;
  std::vector<std::vector<int32_t>> starts;
};

void check_forward_backward(const Case& c) {
  const Shape& shape = c.shape;
  const AttnShape s = shape.attn();
  const std::vector<int32_t> doc = doc_starts(shape.B, shape.T, c.starts);
  std::mt19937 rng(2024);
  const DVec q = random_vec(shape.q_size(), rng, shape.input_std);
  const DVec k = random_vec(shape.kv_size(), rng, shape.input_std);
  const DVec v = random_vec(shape.kv_size(), rng, 1.0);
  const DVec dout = random_vec(shape.q_size(), rng, 1.0);
  const Naive ref(shape, doc);
  DVec out_ref, lse_ref, dq_ref, dk_ref, dv_ref;
  ref.forward(q, k, v, out_ref, lse_ref);
  ref.backward(dout, q, k, v, dq_ref, dk_ref, dv_ref);

  const auto qf = to_float(q), kf = to_float(k), vf = to_float(v), doutf = to_float(dout);
  std::vector<float> out(shape.q_size(), kGarbage), lse(shape.lse_size(), kGarbage);
  attention_forward(host(qf), host(kf), host(vf), host(out), host(lse), s, host(doc));
  EXPECT_LE(rel_err(out, out_ref), kTol);
  EXPECT_LE(rel_err(lse, lse_ref), kTol);
  std::vector<float> dq(shape.q_size(), kGarbage), dk(shape.kv_size(), kGarbage),
      dv(shape.kv_size(), kGarbage);
  attention_backward(host(doutf), host(qf), host(kf), host(vf), host(out), host(lse), host(dq),
                     host(dk), host(dv), s, host(doc));
  EXPECT_LE(rel_err(dq, dq_ref), kTol);
  EXPECT_LE(rel_err(dk, dk_ref), kTol);
  EXPECT_LE(rel_err(dv, dv_ref), kTol);
}

class DocumentMask : public ::testing::TestWithParam<Case> {};

TEST_P(DocumentMask, ForwardAndBackwardMatchNaive) {
  check_forward_backward(GetParam());
}

INSTANTIATE_TEST_SUITE_P(
    Documents, DocumentMask,
    ::testing::Values(
        // One document: the plain causal mask.
        Case{Shape{1, 7, 2, 2, 8, 0.0}, {{0}}},
        // Short documents (one of a single token) inside one tile, GQA.
        Case{Shape{2, 30, 4, 2, 16, 0.0}, {{0, 3, 4, 11, 25}, {0, 17}}},
        // Ragged tiles, documents across tile edges, MQA; the last query tile's rows all start
        // after key tile 0 (skipped), a document starting exactly at a tile edge.
        Case{Shape{2, 200, 4, 1, 16, 0.0}, {{0, 5, 6, 40, 70, 150, 199}, {0, 64, 128}}},
        // Many short documents over several tiles: most key tiles are skipped; sharp softmax.
        Case{Shape{1, 260, 2, 1, 8, 1.0, 2.0}, {{0, 9, 20, 33, 60, 66, 90, 131, 140, 192, 250}}},
        // Largest D, GQA.
        Case{Shape{1, 130, 4, 2, 256, 0.3}, {{0, 64, 100}}}),
    [](const ::testing::TestParamInfo<Case>& info) { return "case" + std::to_string(info.index); });

#ifdef _OPENMP
// The backward's fused (one thread) and split (two threads) schedules, both with skipped tiles.
TEST(DocumentMaskSchedules, BackwardFusedAndSplitMatchNaive) {
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << "threads=" << threads);
    omp_set_num_threads(threads);
    check_forward_backward(Case{Shape{1, 200, 4, 1, 16, 0.0}, {{0, 70, 130, 131}}});
  }
  omp_set_num_threads(saved);
}
#endif

// A key tile that lies before the documents of every row of a query tile is never read: NaN in
// its keys and values would otherwise reach the output (0 * NaN in P V) and dq (dS K). Query
// block at global positions [128, 192), all in the document starting at 100, against the keys
// of positions [0, 192): key tile 0 (0..63) is skipped, tile 1 partly seen, tile 2 causal.
TEST(DocumentMaskSkip, KeyTilesBeforeEveryRowsDocumentAreNotRead) {
  const int64_t B = 1, T = 64, Tk = 192, H = 2, D = 8, q_pos0 = 128, start = 100;
  std::mt19937 rng(5);
  const Shape whole{B, q_pos0 + T, H, H, D, 0.0};
  const std::vector<int32_t> doc_whole = doc_starts(B, whole.T, {{0, int32_t(start)}});
  const DVec q = random_vec(whole.q_size(), rng, 1.0), k = random_vec(whole.kv_size(), rng, 1.0),
             v = random_vec(whole.kv_size(), rng, 1.0), dout = random_vec(whole.q_size(), rng, 1.0);
  DVec out_ref, lse_ref, dq_ref, dk_ref, dv_ref;
  const Naive ref(whole, doc_whole);
  ref.forward(q, k, v, out_ref, lse_ref);
  ref.backward(dout, q, k, v, dq_ref, dk_ref, dv_ref);

  // The block's operands: the last 64 query rows, every key row (tile 0 poisoned).
  const int64_t HD = H * D;
  auto rows = [](const DVec& x, int64_t first, int64_t n, int64_t w) {
    return std::vector<float>(x.begin() + first * w, x.begin() + (first + n) * w);
  };
  const auto qb = rows(q, q_pos0, T, HD), db = rows(dout, q_pos0, T, HD);
  auto kb = rows(k, 0, Tk, HD), vb = rows(v, 0, Tk, HD);
  for (int64_t i = 0; i < 64 * HD; ++i) kb[size_t(i)] = vb[size_t(i)] = kGarbage;
  const std::vector<int32_t> doc(static_cast<size_t>(T), static_cast<int32_t>(start));
  const AttnShape s{B, T, H, H, D, float(1.0 / std::sqrt(double(D))), Tk, q_pos0, 0};
  std::vector<float> out(size_t(T * HD), kGarbage), lse(size_t(H * T), kGarbage);
  attention_forward(host(qb), host(kb), host(vb), host(out), host(lse), s, host(doc));
  // This block holds every key the rows see: it is the whole attention of these rows.
  DVec out_rows(out_ref.begin() + q_pos0 * HD, out_ref.end());
  EXPECT_LE(rel_err(out, out_rows), kTol);
  std::vector<float> dq(qb.size(), kGarbage), dk(kb.size(), kGarbage), dv(vb.size(), kGarbage);
  attention_backward(host(db), host(qb), host(kb), host(vb), host(out), host(lse), host(dq),
                     host(dk), host(dv), s, host(doc));
  // dk, dv of these rows alone (earlier rows of the whole sequence add to keys 100..127 too):
  // 0 on keys 0..99, the naive sums from these rows on 100..191.
  DVec dk_blk(size_t(Tk * HD), 0.0), dv_blk(size_t(Tk * HD), 0.0);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < T; ++i) {
      const int64_t qi = q_pos0 + i;
      DVec p;
      ref.probs(q, k, 0, qi, h, p);
      double rowdot = 0;
      DVec dp(size_t(qi + 1), 0.0);
      for (int64_t j = start; j <= qi; ++j) {
        for (int64_t d = 0; d < D; ++d) dp[j] += dout[qi * HD + h * D + d] * v[j * HD + h * D + d];
        rowdot += p[j] * dp[j];
      }
      for (int64_t j = start; j <= qi; ++j)
        for (int64_t d = 0; d < D; ++d) {
          const double ds = p[j] * (dp[j] - rowdot) * s.scale;
          dv_blk[j * HD + h * D + d] += p[j] * dout[qi * HD + h * D + d];
          dk_blk[j * HD + h * D + d] += ds * q[qi * HD + h * D + d];
        }
    }
  EXPECT_LE(rel_err(dk, dk_blk), kTol);
  EXPECT_LE(rel_err(dv, dv_blk), kTol);
  // The rows see only keys of this block: their dq is that of the whole.
  EXPECT_LE(rel_err(dq, DVec(dq_ref.begin() + q_pos0 * HD, dq_ref.end())), kTol);
}

// A block whose keys all lie before the rows' documents: out 0 and lse -inf (nothing seen), and
// its backward adds nothing, as for a block wholly in the future.
TEST(DocumentMaskSkip, BlockBeforeTheDocumentsIsEmpty) {
  const int64_t B = 1, T = 5, H = 2, D = 4;
  std::vector<float> q(B * T * H * D, 0.5f), k(q), v(q), out(q.size(), kGarbage),
      lse(B * H * T, kGarbage);
  const std::vector<int32_t> doc(static_cast<size_t>(T),
                                 7);  // rows at 10..14, documents from 7; keys 0..4
  const AttnShape s{B, T, H, H, D, 0.5f, T, 10, 0};
  attention_forward(host(q), host(k), host(v), host(out), host(lse), s, host(doc));
  for (float x : out) EXPECT_EQ(x, 0.0f);
  for (float x : lse) EXPECT_EQ(x, -std::numeric_limits<float>::infinity());
  std::vector<float> lse_whole(lse.size(), 1.0f), dq(q.size(), kGarbage), dk(q.size(), kGarbage),
      dv(q.size(), kGarbage);
  attention_backward(host(q), host(q), host(k), host(v), host(q), host(lse_whole), host(dq),
                     host(dk), host(dv), s, host(doc));
  for (size_t i = 0; i < q.size(); ++i) {
    EXPECT_EQ(dq[i], 0.0f);
    EXPECT_EQ(dk[i], 0.0f);
    EXPECT_EQ(dv[i], 0.0f);
  }
}

// Context parallelism's zigzag blocks with documents: each query chunk merges its blocks
// against every key chunk (positions q_pos0, k_pos0, the chunk's slice of doc_start), and the
// gradients are the sums of the blocks' backwards; both equal the naive whole.
void check_blocks(const Shape& shape, const std::vector<std::vector<int32_t>>& starts,
                  const std::vector<std::pair<int64_t, int64_t>>& chunks) {
  const int64_t B = shape.B, T = shape.T, Hq = shape.Hq, Hkv = shape.Hkv, D = shape.D;
  const float scale = shape.attn().scale;
  const std::vector<int32_t> doc = doc_starts(B, T, starts);
  std::mt19937 rng(77);
  const DVec q = random_vec(shape.q_size(), rng, 1.0), k = random_vec(shape.kv_size(), rng, 1.0),
             v = random_vec(shape.kv_size(), rng, 1.0), dout = random_vec(shape.q_size(), rng, 1.0);
  const Naive ref(shape, doc);
  DVec out_ref, lse_ref, dq_ref, dk_ref, dv_ref;
  ref.forward(q, k, v, out_ref, lse_ref);
  ref.backward(dout, q, k, v, dq_ref, dk_ref, dv_ref);

  auto rows = [&](const DVec& x, int64_t w, int64_t start, int64_t len) {
    std::vector<float> y(size_t(B * len * w));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < len * w; ++i)
        y[size_t(b * len * w + i)] = float(x[size_t((b * T + start) * w + i)]);
    return y;
  };
  auto docs_of = [&](int64_t start, int64_t len) {
    std::vector<int32_t> y(size_t(B * len));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < len; ++i) y[size_t(b * len + i)] = doc[size_t(b * T + start + i)];
    return y;
  };
  auto add_rows = [&](const std::vector<float>& y, int64_t w, int64_t start, int64_t len, DVec& x) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < len * w; ++i)
        x[size_t((b * T + start) * w + i)] += y[size_t(b * len * w + i)];
  };
  DVec out_all(q.size(), 0.0), dq(q.size(), 0.0), dk(k.size(), 0.0), dv(v.size(), 0.0);
  for (const auto& [qs, ql] : chunks) {
    const auto qb = rows(q, Hq * D, qs, ql), db = rows(dout, Hq * D, qs, ql);
    const std::vector<int32_t> dc = docs_of(qs, ql);
    std::vector<float> out(qb.size(), kGarbage), lse(size_t(B * Hq * ql), kGarbage);
    std::vector<float> part(qb.size(), kGarbage), part_lse(lse.size(), kGarbage);
    bool first = true;
    for (const auto& [ks, kl] : chunks) {
      const auto kb = rows(k, Hkv * D, ks, kl), vb = rows(v, Hkv * D, ks, kl);
      const AttnShape s{B, ql, Hq, Hkv, D, scale, kl, qs, ks};
      attention_forward(host(qb), host(kb), host(vb), host(first ? out : part),
                        host(first ? lse : part_lse), s, host(dc));
      if (!first) attention_merge(host(out), host(lse), host(part), host(part_lse), B, ql, Hq, D);
      first = false;
    }
    add_rows(out, Hq * D, qs, ql, out_all);
    for (const auto& [ks, kl] : chunks) {
      const auto kb = rows(k, Hkv * D, ks, kl), vb = rows(v, Hkv * D, ks, kl);
      std::vector<float> dqb(qb.size(), kGarbage), dkb(kb.size(), kGarbage),
          dvb(vb.size(), kGarbage);
      const AttnShape s{B, ql, Hq, Hkv, D, scale, kl, qs, ks};
      attention_backward(host(db), host(qb), host(kb), host(vb), host(out), host(lse), host(dqb),
                         host(dkb), host(dvb), s, host(dc));
      add_rows(dqb, Hq * D, qs, ql, dq);
      add_rows(dkb, Hkv * D, ks, kl, dk);
      add_rows(dvb, Hkv * D, ks, kl, dv);
    }
  }
  EXPECT_LE(rel_err(to_float(out_all), out_ref), kTol);
  EXPECT_LE(rel_err(to_float(dq), dq_ref), kTol);
  EXPECT_LE(rel_err(to_float(dk), dk_ref), kTol);
  EXPECT_LE(rel_err(to_float(dv), dv_ref), kTol);
}

TEST(DocumentMaskBlocks, ZigzagChunksMergeToTheWhole) {
  // cp = 2 zigzag over 32 tokens (rank 0: chunks 0 and 3, rank 1: 1 and 2), documents that
  // cross chunk edges, one starting at a chunk edge, GQA.
  check_blocks(Shape{2, 32, 2, 1, 8, 0.0}, {{0, 5, 8, 19}, {0, 30}},
               {{0, 8}, {24, 8}, {8, 8}, {16, 8}});
  // Chunks longer than a tile: query rows whose document starts in an earlier chunk, and
  // blocks wholly before a chunk's documents.
  check_blocks(Shape{1, 256, 4, 2, 16, 0.0}, {{0, 10, 70, 150, 200}},
               {{0, 64}, {192, 64}, {64, 64}, {128, 64}});
}

// ---- RoPE at per-token positions ------------------------------------------------------------

TEST(RopeAt, EqualsRopeAtEachTokensPosition) {
  const int64_t B = 2, T = 9, H = 3, D = 8;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist;
  std::vector<float> x0(size_t(B * T * H * D));
  for (float& e : x0) e = dist(rng);
  // Positions that restart (documents): token n of sequence b at pos[b * T + t].
  const std::vector<int32_t> pos = {0, 1, 2, 0, 1, 0, 1, 2, 3, 5, 6, 7, 8, 0, 0, 1, 2, 3};
  for (bool inverse : {false, true}) {
    std::vector<float> x = x0, y = x0;
    rope_at(host(x), host(pos), B * T, H, D, 500.0f, inverse);
    for (int64_t n = 0; n < B * T; ++n) {
      const Tensor row = host(y).slice(n * H * D, H * D);
      rope(row, 1, 1, H, D, pos[size_t(n)], 500.0f, inverse);
    }
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i], y[i]) << i;
  }
}

}  // namespace
}  // namespace tessera::kernels
