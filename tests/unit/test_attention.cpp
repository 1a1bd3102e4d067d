// Tests the CPU causal attention kernels against a naive full-softmax implementation in
// double precision; the naive backward is itself checked by central finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <ostream>
#include <random>
#include <sstream>
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

TEST(AttentionNaive, BackwardMatchesFiniteDifference) {
  // Loss = sum(out * R); its gradient is the naive backward with dout = R.
  const Shape shape{1, 5, 4, 2, 3, 0.0};
  const Naive naive(shape);
  std::mt19937 rng(7);
  DVec q = random_vec(shape.q_size(), rng, 1.0), k = random_vec(shape.kv_size(), rng, 1.0),
       v = random_vec(shape.kv_size(), rng, 1.0), R = random_vec(shape.q_size(), rng, 1.0);
  DVec dq, dk, dv;
  naive.backward(R, q, k, v, dq, dk, dv);

  auto loss = [&] {
    DVec out, lse;
    naive.forward(q, k, v, out, lse);
    double acc = 0;
    for (size_t i = 0; i < out.size(); ++i) acc += out[i] * R[i];
    return acc;
  };
  auto fd_grad = [&](DVec& x) {
    const double eps = 1e-5;
    DVec g(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      const double x0 = x[i];
      x[i] = x0 + eps;
      const double up = loss();
      x[i] = x0 - eps;
      const double down = loss();
      x[i] = x0;
      g[i] = (up - down) / (2 * eps);
    }
    return g;
  };
  EXPECT_LE(rel_err(dq, fd_grad(q)), 1e-8);
  EXPECT_LE(rel_err(dk, fd_grad(k)), 1e-8);
  EXPECT_LE(rel_err(dv, fd_grad(v)), 1e-8);
}

class AttentionCpu : public ::testing::TestWithParam<Shape> {};

TEST_P(AttentionCpu, ForwardMatchesNaive) {
  const Shape shape = GetParam();
  const AttnShape s = shape.attn();
  std::mt19937 rng(1234);
  const DVec q = random_vec(shape.q_size(), rng, shape.input_std);
  const DVec k = random_vec(shape.kv_size(), rng, shape.input_std);
  const DVec v = random_vec(shape.kv_size(), rng, 1.0);
  DVec out_ref, lse_ref;
  Naive(shape).forward(q, k, v, out_ref, lse_ref);

  const auto qf = to_float(q), kf = to_float(k), vf = to_float(v);
  std::vector<float> out(shape.q_size(), kGarbage), lse(shape.lse_size(), kGarbage);
  attention_forward(host(qf), host(kf), host(vf), host(out), host(lse), s);
  EXPECT_LE(rel_err(out, out_ref), kTol);
  EXPECT_LE(rel_err(lse, lse_ref), kTol);
}

// Runs the float backward (inputs: float forward's out and lse) and compares with naive.
void check_backward(const Shape& shape) {
  const AttnShape s = shape.attn();
  std::mt19937 rng(4321);
  const DVec q = random_vec(shape.q_size(), rng, shape.input_std);
  const DVec k = random_vec(shape.kv_size(), rng, shape.input_std);
  const DVec v = random_vec(shape.kv_size(), rng, 1.0);
  const DVec dout = random_vec(shape.q_size(), rng, 1.0);
  DVec dq_ref, dk_ref, dv_ref;
  Naive(shape).backward(dout, q, k, v, dq_ref, dk_ref, dv_ref);

  const auto qf = to_float(q), kf = to_float(k), vf = to_float(v), doutf = to_float(dout);
  std::vector<float> out(shape.q_size()), lse(shape.lse_size());
  attention_forward(host(qf), host(kf), host(vf), host(out), host(lse), s);
  // Garbage-filled so that a missing overwrite shows up.
  std::vector<float> dq(shape.q_size(), kGarbage), dk(shape.kv_size(), kGarbage),
      dv(shape.kv_size(), kGarbage);
  attention_backward(host(doutf), host(qf), host(kf), host(vf), host(out), host(lse), host(dq),
                     host(dk), host(dv), s);
  EXPECT_LE(rel_err(dq, dq_ref), kTol);
  EXPECT_LE(rel_err(dk, dk_ref), kTol);
  EXPECT_LE(rel_err(dv, dv_ref), kTol);
}

TEST_P(AttentionCpu, BackwardMatchesNaive) {
  check_backward(GetParam());
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionCpu,
    ::testing::Values(Shape{1, 1, 1, 1, 8, 0.0},          // single token
                      Shape{2, 1, 4, 2, 16, 0.0},         // single token, GQA
                      Shape{1, 7, 2, 2, 8, 0.0},          // T < tile, MHA
                      Shape{2, 7, 4, 1, 16, 0.0},         // T < tile, MQA
                      Shape{2, 64, 4, 4, 64, 0.0},        // exactly one tile
                      Shape{1, 64, 4, 2, 16, 0.0},        // one tile, GQA
                      Shape{2, 130, 2, 2, 64, 0.0},       // 3 tiles, ragged last tile
                      Shape{1, 130, 4, 2, 16, 0.0},       // ragged, GQA
                      Shape{2, 130, 4, 1, 64, 0.0},       // ragged, MQA
                      Shape{1, 130, 4, 1, 8, 0.0},        // ragged, MQA, small D
                      Shape{2, 100, 3, 1, 20, 0.0},       // D not a multiple of 8, Hq=3
                      Shape{1, 200, 2, 1, 16, 1.0, 2.0},  // sharp softmax (scores ~ N(0, 64))
                      Shape{1, 70, 2, 2, 256, 0.3}),      // largest D, custom scale
    [](const ::testing::TestParamInfo<Shape>& info) {
      std::ostringstream os;
      os << "B" << info.param.B << "T" << info.param.T << "Hq" << info.param.Hq << "Hkv"
         << info.param.Hkv << "D" << info.param.D << "_" << info.index;
      return os.str();
    });

#ifdef _OPENMP
// The backward picks a fused schedule (parallel over (b, kv head)) or a split one (dk/dv per
// key tile, then dq per query tile) from the thread count: fused iff the B*Hkv work items keep
// the threads busy enough. With B*Hkv = 1, one thread gives fused and two give split.
TEST(AttentionCpuSchedules, BackwardFusedAndSplitMatchNaive) {
  const int saved = omp_get_max_threads();
  for (const Shape& shape : {Shape{1, 130, 4, 1, 16, 0.0}, Shape{1, 130, 2, 1, 64, 0.0}}) {
    for (int threads : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << shape << " threads=" << threads);
      omp_set_num_threads(threads);
      check_backward(shape);
    }
  }
  omp_set_num_threads(saved);
}
#endif

// ---- blocks with position offsets (context parallelism) -----------------------------------

// Rows [start, start + len) of each sequence of a [B, T, H, D] tensor, as [B, len, H, D].
std::vector<float> rows_of(const std::vector<float>& x, int64_t B, int64_t T, int64_t HD,
                           int64_t start, int64_t len) {
  std::vector<float> y(size_t(B * len * HD));
  for (int64_t b = 0; b < B; ++b)
    std::copy_n(x.begin() + (b * T + start) * HD, len * HD, y.begin() + b * len * HD);
  return y;
}
// Adds a [B, len, H, D] block into rows [start, start + len) of a [B, T, H, D] one.
void add_rows(const std::vector<float>& y, int64_t B, int64_t T, int64_t HD, int64_t start,
              int64_t len, DVec& x) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < len * HD; ++i)
      x[size_t((b * T + start) * HD + i)] += y[size_t(b * len * HD + i)];
}
// The [B, H, len] statistics of rows [start, start + len) of a [B, H, T] one.
std::vector<float> stats_of(const std::vector<float>& x, int64_t B, int64_t H, int64_t T,
                            int64_t start, int64_t len) {
  std::vector<float> y(size_t(B * H * len));
  for (int64_t bh = 0; bh < B * H; ++bh)
    std::copy_n(x.begin() + bh * T + start, len, y.begin() + bh * len);
  return y;
}

struct Chunk {
  int64_t start, len;
};

// Splits the sequence into chunks, computes each query chunk's attention as the merge of its
// blocks against every key chunk (in the order given, so blocks wholly in the future and
// blocks merged before the diagonal one both occur), and its gradients as the sum of the
// blocks' backwards with the merged out and lse; compares both with the naive whole.
void check_blocks(const Shape& shape, const std::vector<Chunk>& chunks) {
  const int64_t B = shape.B, T = shape.T, Hq = shape.Hq, Hkv = shape.Hkv, D = shape.D;
  const float scale = shape.attn().scale;
  std::mt19937 rng(99);
  const DVec q = random_vec(shape.q_size(), rng, shape.input_std);
  const DVec k = random_vec(shape.kv_size(), rng, shape.input_std);
  const DVec v = random_vec(shape.kv_size(), rng, 1.0);
  const DVec dout = random_vec(shape.q_size(), rng, 1.0);
  const Naive naive(shape);
  DVec out_ref, lse_ref, dq_ref, dk_ref, dv_ref;
  naive.forward(q, k, v, out_ref, lse_ref);
  naive.backward(dout, q, k, v, dq_ref, dk_ref, dv_ref);

  const auto qf = to_float(q), kf = to_float(k), vf = to_float(v), doutf = to_float(dout);
  DVec out_all(q.size(), 0.0), lse_all(lse_ref.size(), 0.0), dq(q.size(), 0.0), dk(k.size(), 0.0),
      dv(v.size(), 0.0);
  for (const Chunk& qc : chunks) {
    const auto qb = rows_of(qf, B, T, Hq * D, qc.start, qc.len);
    std::vector<float> out(qb.size(), kGarbage), lse(size_t(B * Hq * qc.len), kGarbage);
    std::vector<float> part(qb.size(), kGarbage), part_lse(lse.size(), kGarbage);
    bool first = true;
    for (const Chunk& kc : chunks) {
      const auto kb = rows_of(kf, B, T, Hkv * D, kc.start, kc.len);
      const auto vb = rows_of(vf, B, T, Hkv * D, kc.start, kc.len);
      AttnShape s{B, qc.len, Hq, Hkv, D, scale, kc.len, qc.start, kc.start};
      attention_forward(host(qb), host(kb), host(vb), host(first ? out : part),
                        host(first ? lse : part_lse), s);
      if (!first)
        attention_merge(host(out), host(lse), host(part), host(part_lse), B, qc.len, Hq, D);
      first = false;
    }
    add_rows(out, B, T, Hq * D, qc.start, qc.len, out_all);
    for (int64_t bh = 0; bh < B * Hq; ++bh)
      for (int64_t i = 0; i < qc.len; ++i)
        lse_all[size_t(bh * T + qc.start + i)] = lse[size_t(bh * qc.len + i)];
  }
  EXPECT_LE(rel_err(to_float(out_all), out_ref), kTol);
  EXPECT_LE(rel_err(to_float(lse_all), lse_ref), kTol);

  const auto out_f = to_float(out_all), lse_f = to_float(lse_all);
  for (const Chunk& qc : chunks) {
    const auto qb = rows_of(qf, B, T, Hq * D, qc.start, qc.len);
    const auto db = rows_of(doutf, B, T, Hq * D, qc.start, qc.len);
    const auto ob = rows_of(out_f, B, T, Hq * D, qc.start, qc.len);
    const auto lb = stats_of(lse_f, B, Hq, T, qc.start, qc.len);
    for (const Chunk& kc : chunks) {
      const auto kb = rows_of(kf, B, T, Hkv * D, kc.start, kc.len);
      const auto vb = rows_of(vf, B, T, Hkv * D, kc.start, kc.len);
      std::vector<float> dqb(qb.size(), kGarbage), dkb(kb.size(), kGarbage),
          dvb(vb.size(), kGarbage);
      AttnShape s{B, qc.len, Hq, Hkv, D, scale, kc.len, qc.start, kc.start};
      attention_backward(host(db), host(qb), host(kb), host(vb), host(ob), host(lb), host(dqb),
                         host(dkb), host(dvb), s);
      add_rows(dqb, B, T, Hq * D, qc.start, qc.len, dq);
      add_rows(dkb, B, T, Hkv * D, kc.start, kc.len, dk);
      add_rows(dvb, B, T, Hkv * D, kc.start, kc.len, dv);
    }
  }
  EXPECT_LE(rel_err(to_float(dq), dq_ref), kTol);
  EXPECT_LE(rel_err(to_float(dk), dk_ref), kTol);
  EXPECT_LE(rel_err(to_float(dv), dv_ref), kTol);
}

TEST(AttentionBlocks, ZigzagChunksMergeToTheWhole) {
  // cp = 2 zigzag: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2 (here in rank order).
  check_blocks(Shape{2, 32, 2, 1, 8, 0.0}, {{0, 8}, {24, 8}, {8, 8}, {16, 8}});
  // Chunks longer than a tile, not tile-aligned, GQA.
  check_blocks(Shape{1, 200, 4, 2, 16, 0.0}, {{100, 100}, {0, 100}});
  check_blocks(Shape{1, 180, 2, 2, 16, 0.0}, {{150, 30}, {0, 70}, {70, 80}});
}

TEST(AttentionBlocks, BlockWhollyInTheFutureIsEmpty) {
  const int64_t B = 1, T = 5, H = 2, D = 4;
  std::vector<float> q(B * T * H * D, 0.5f), k(q), v(q), out(q.size(), kGarbage),
      lse(B * H * T, kGarbage);
  attention_forward(host(q), host(k), host(v), host(out), host(lse),
                    AttnShape{B, T, H, H, D, 0.5f, T, 0, T});
  for (float x : out) EXPECT_EQ(x, 0.0f);
  for (float x : lse) EXPECT_EQ(x, -std::numeric_limits<float>::infinity());
  // Its backward contributes nothing (lse of the whole attention is finite).
  std::vector<float> lse_whole(lse.size(), 1.0f), dq(q.size(), kGarbage), dk(q.size(), kGarbage),
      dv(q.size(), kGarbage);
  attention_backward(host(q), host(q), host(k), host(v), host(q), host(lse_whole), host(dq),
                     host(dk), host(dv), AttnShape{B, T, H, H, D, 0.5f, T, 0, T});
  for (size_t i = 0; i < q.size(); ++i) {
    EXPECT_EQ(dq[i], 0.0f);
    EXPECT_EQ(dk[i], 0.0f);
    EXPECT_EQ(dv[i], 0.0f);
  }
}

TEST(AttentionBlocks, MergeMatchesTheWholeSoftmax) {
  // Two halves of a key set: merging their (out, lse) equals attention over the union.
  const int64_t B = 1, T = 3, H = 1, D = 2;
  std::vector<float> out = {1, 2, 3, 4, 5, 6},
                     lse = {0.0f, 1.0f, -std::numeric_limits<float>::infinity()};
  std::vector<float> part = {7, 8, 9, 10, 11, 12}, part_lse = {0.0f, 0.0f, 2.0f};
  attention_merge(host(out), host(lse), host(part), host(part_lse), B, T, H, D);
  EXPECT_NEAR(out[0], 4.0f, 1e-6);
  EXPECT_NEAR(out[1], 5.0f, 1e-6);
  const double w = std::exp(1.0) / (std::exp(1.0) + 1.0);
  EXPECT_NEAR(out[2], w * 3 + (1 - w) * 9, 1e-5);
  EXPECT_NEAR(lse[0], std::log(2.0), 1e-6);
  EXPECT_NEAR(lse[1], std::log(std::exp(1.0) + 1.0), 1e-6);
  EXPECT_EQ(out[4], 11.0f);  // the running side had no key: the part is taken as it is
  EXPECT_EQ(lse[2], 2.0f);
}

}  // namespace
}  // namespace tessera::kernels
