// The CUDA attention kernels against the CPU ones on the same inputs: out, lse and the three
// gradients, norm-wise within 1e-5 (cuda_test_util.hpp), over the shapes the CPU tests use
// (single token, ragged tiles, GQA, MQA, head dims padded to 32/64/128, sharp softmax). The
// backward runs on the GPU's own out and lse, as in training. A long sequence checks that no
// T x T buffer is allocated. The bf16 products (AttnShape::compute) against the CPU's bf16.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <sstream>
#include <vector>

#include "core/error.hpp"
#include "cuda_test_util.hpp"

namespace tessera::kernels {
namespace {

using namespace test_cuda;

struct Case {
  int64_t B, T, Hq, Hkv, D;
  double input_std = 1.0;  // of q and k
  float scale = 0.0f;      // 0: 1/sqrt(D)
  AttnShape shape() const {
    return {B, T, Hq, Hkv, D, scale != 0.0f ? scale : float(1.0 / std::sqrt(double(D)))};
  }
  int64_t q_size() const { return B * T * Hq * D; }
  int64_t kv_size() const { return B * T * Hkv * D; }
  int64_t lse_size() const { return B * Hq * T; }
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "B" << c.B << " T" << c.T << " Hq" << c.Hq << " Hkv" << c.Hkv << " D" << c.D << " std "
      << c.input_std << " scale " << c.scale;
}

class CudaAttention : public CudaTest, public ::testing::WithParamInterface<Case> {};

TEST_P(CudaAttention, ForwardAndBackwardMatchCpu) {
  const Case c = GetParam();
  const AttnShape s = c.shape();
  const FVec q = randn(c.q_size(), 1, c.input_std), k = randn(c.kv_size(), 2, c.input_std);
  const FVec v = randn(c.kv_size(), 3), dout = randn(c.q_size(), 4);

  FVec out(c.q_size()), lse(c.lse_size()), dq(c.q_size()), dk(c.kv_size()), dv(c.kv_size());
  attention_forward(host(q), host(k), host(v), host(out), host(lse), s);
  attention_backward(host(dout), host(q), host(k), host(v), host(out), host(lse), host(dq),
                     host(dk), host(dv), s);

  // Outputs start as NaN, so an element the kernels never write shows up.
  const float nan = std::nanf("");
  Dev<float> dQ(q), dK(k), dV(v), dO(dout), dOut(FVec(c.q_size(), nan)),
      dLse(FVec(c.lse_size(), nan));
  Dev<float> gQ(FVec(c.q_size(), nan)), gK(FVec(c.kv_size(), nan)), gV(FVec(c.kv_size(), nan));
  attention_forward(dQ, dK, dV, dOut, dLse, s);
  attention_backward(dO, dQ, dK, dV, dOut, dLse, gQ, gK, gV, s);
  expect_normwise(dOut.host(), out, kRel, "out");
  expect_normwise(dLse.host(), lse, kRel, "lse");
  expect_normwise(gQ.host(), dq, kRel, "dq");
  expect_normwise(gK.host(), dk, kRel, "dk");
  expect_normwise(gV.host(), dv, kRel, "dv");
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention,
                         ::testing::Values(Case{1, 1, 1, 1, 8},      // single token
                                           Case{2, 1, 4, 2, 16},     // single token, GQA
                                           Case{1, 7, 2, 2, 8},      // T < tile
                                           Case{2, 7, 4, 1, 16},     // T < tile, MQA
                                           Case{2, 64, 4, 4, 64},    // exactly one tile
                                           Case{2, 130, 2, 2, 64},   // ragged last tile
                                           Case{1, 130, 4, 2, 16},   // ragged, GQA
                                           Case{2, 130, 4, 1, 64},   // ragged, MQA
                                           Case{2, 100, 3, 1, 20},   // D padded to 32, Hq = 3
                                           Case{1, 200, 4, 2, 80},   // D padded to 128
                                           Case{1, 257, 2, 1, 128},  // largest D, 5 tiles
                                           Case{1, 200, 2, 1, 16,
                                                2.0},  // sharp softmax (scores ~ N(0, 64))
                                           Case{1, 70, 2, 2, 32, 1.0, 0.3f}),  // custom scale
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const Case& c = info.param;
                           std::ostringstream os;
                           os << "B" << c.B << "T" << c.T << "Hq" << c.Hq << "Hkv" << c.Hkv << "D"
                              << c.D << "_" << info.index;
                           return os.str();
                         });

// Blocks of a longer sequence (context parallelism): a key length and position offsets
// (AttnShape::Tk, q_pos0, k_pos0), against the CPU on the same inputs; every query row of
// these blocks sees at least one key, so lse is finite.
struct BlockCase {
  int64_t B, T, Tk, Hq, Hkv, D, q_pos0, k_pos0;
  AttnShape shape() const {
    return {B, T, Hq, Hkv, D, float(1.0 / std::sqrt(double(D))), Tk, q_pos0, k_pos0};
  }
};

class CudaAttentionBlocks : public CudaTest, public ::testing::WithParamInterface<BlockCase> {};

TEST_P(CudaAttentionBlocks, ForwardAndBackwardMatchCpu) {
  const BlockCase c = GetParam();
  const AttnShape s = c.shape();
  const int64_t nq = c.B * c.T * c.Hq * c.D, nkv = c.B * c.Tk * c.Hkv * c.D, nl = c.B * c.Hq * c.T;
  const FVec q = randn(nq, 11), k = randn(nkv, 12), v = randn(nkv, 13), dout = randn(nq, 14);
  FVec out(nq), lse(nl), dq(nq), dk(nkv), dv(nkv);
  attention_forward(host(q), host(k), host(v), host(out), host(lse), s);
  attention_backward(host(dout), host(q), host(k), host(v), host(out), host(lse), host(dq),
                     host(dk), host(dv), s);
  const float nan = std::nanf("");
  Dev<float> dQ(q), dK(k), dV(v), dO(dout), dOut(FVec(nq, nan)), dLse(FVec(nl, nan));
  Dev<float> gQ(FVec(nq, nan)), gK(FVec(nkv, nan)), gV(FVec(nkv, nan));
  attention_forward(dQ, dK, dV, dOut, dLse, s);
  attention_backward(dO, dQ, dK, dV, dOut, dLse, gQ, gK, gV, s);
  expect_normwise(dOut.host(), out, kRel, "out");
  expect_normwise(dLse.host(), lse, kRel, "lse");
  expect_normwise(gQ.host(), dq, kRel, "dq");
  expect_normwise(gK.host(), dk, kRel, "dk");
  expect_normwise(gV.host(), dv, kRel, "dv");
  // Merged with itself, a block is unchanged and its lse grows by log 2.
  Dev<float> mOut(out), mLse(lse), pOut(out), pLse(lse);
  attention_merge(mOut, mLse, pOut, pLse, c.B, c.T, c.Hq, c.D);
  FVec lse2 = lse;
  for (float& x : lse2) x += std::log(2.0f);
  expect_normwise(mOut.host(), out, kRel, "merged out");
  expect_normwise(mLse.host(), lse2, kRel, "merged lse");
}

INSTANTIATE_TEST_SUITE_P(Blocks, CudaAttentionBlocks,
                         ::testing::Values(BlockCase{2, 70, 130, 4, 2, 32, 130, 0},   // all visible
                                           BlockCase{2, 64, 64, 2, 2, 64, 64, 64},    // diagonal
                                           BlockCase{1, 90, 150, 2, 1, 64, 100, 70},  // ragged
                                           BlockCase{1, 8, 8, 2, 2, 16, 24, 8}),      // zigzag
                         [](const ::testing::TestParamInfo<BlockCase>& info) {
                           std::ostringstream os;
                           os << "T" << info.param.T << "Tk" << info.param.Tk << "_" << info.index;
                           return os.str();
                         });

// bf16 products (AttnShape::compute = bf16): both backends round the same operands (scale q, k,
// v, dout; P and dS before their products) and sum in fp32 in different orders, so they differ
// by fp32 summation and by the few values that lie within fp32 error of a bf16 rounding
// boundary and round the other way, the residue the unit test bounds against a double
// reference (tests/unit/test_attention_bf16.cpp: measured <= 1.4e-5 there, bar 2e-4). The
// fp32 CUDA kernel on the same inputs must be farther than twice the bar from the CPU's bf16
// result (the roundings themselves move it by 1e-3 or more), so a GPU kernel that ignored the
// dtype fails.
constexpr double kBf16Rel = 2e-4;

struct Bf16Case {
  int64_t B, T, Tk, Hq, Hkv, D, q_pos0, k_pos0;
  AttnShape shape(DType compute) const {
    return {B, T, Hq, Hkv, D, float(1.0 / std::sqrt(double(D))), Tk, q_pos0, k_pos0, compute};
  }
};

void PrintTo(const Bf16Case& c, std::ostream* os) {
  *os << "B" << c.B << " T" << c.T << " Tk" << c.Tk << " Hq" << c.Hq << " Hkv" << c.Hkv << " D"
      << c.D << " q_pos0 " << c.q_pos0 << " k_pos0 " << c.k_pos0;
}

class CudaAttentionBf16 : public CudaTest, public ::testing::WithParamInterface<Bf16Case> {};

double normwise_diff(const FVec& a, const FVec& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    n += double(b[i]) * b[i];
  }
  return std::sqrt(d / n);
}

TEST_P(CudaAttentionBf16, MatchesCpuBf16) {
  const Bf16Case c = GetParam();
  const AttnShape s = c.shape(DType::bf16);
  const int64_t nq = c.B * c.T * c.Hq * c.D, nkv = c.B * c.Tk * c.Hkv * c.D, nl = c.B * c.Hq * c.T;
  const FVec q = randn(nq, 41), k = randn(nkv, 42), v = randn(nkv, 43), dout = randn(nq, 44);
  FVec out(nq), lse(nl), dq(nq), dk(nkv), dv(nkv);
  attention_forward(host(q), host(k), host(v), host(out), host(lse), s);
  attention_backward(host(dout), host(q), host(k), host(v), host(out), host(lse), host(dq),
                     host(dk), host(dv), s);
  const float nan = std::nanf("");
  Dev<float> dQ(q), dK(k), dV(v), dO(dout), dOut(FVec(nq, nan)), dLse(FVec(nl, nan));
  Dev<float> gQ(FVec(nq, nan)), gK(FVec(nkv, nan)), gV(FVec(nkv, nan));
  attention_forward(dQ, dK, dV, dOut, dLse, s);
  attention_backward(dO, dQ, dK, dV, dOut, dLse, gQ, gK, gV, s);
  expect_normwise(dOut.host(), out, kBf16Rel, "out");
  expect_normwise(dLse.host(), lse, kBf16Rel, "lse");  // sums the rounded P
  expect_normwise(gQ.host(), dq, kBf16Rel, "dq");
  expect_normwise(gK.host(), dk, kBf16Rel, "dk");
  expect_normwise(gV.host(), dv, kBf16Rel, "dv");
  // The fp32 GPU kernel is away from the bf16 result.
  Dev<float> fOut(FVec(nq, nan)), fLse(FVec(nl, nan));
  attention_forward(dQ, dK, dV, fOut, fLse, c.shape(DType::f32));
  EXPECT_GT(normwise_diff(fOut.host(), out), 2 * kBf16Rel);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttentionBf16,
                         ::testing::Values(Bf16Case{2, 130, 130, 4, 2, 64, 0, 0},    // ragged, GQA
                                           Bf16Case{1, 100, 100, 3, 1, 20, 0, 0},    // D 20 -> 32
                                           Bf16Case{1, 257, 257, 2, 1, 128, 0, 0},   // largest D
                                           Bf16Case{1, 90, 150, 2, 1, 64, 100, 70},  // CP block
                                           Bf16Case{2, 70, 130, 4, 2, 32, 130, 0}),  // all visible
                         [](const ::testing::TestParamInfo<Bf16Case>& info) {
                           std::ostringstream os;
                           os << "T" << info.param.T << "Tk" << info.param.Tk << "D" << info.param.D
                              << "_" << info.index;
                           return os.str();
                         });

class CudaAttentionFuture : public CudaTest {};

TEST_F(CudaAttentionFuture, BlockInTheFutureIsEmpty) {
  const BlockCase c{1, 5, 5, 2, 2, 16, 0, 5};  // every key after every query
  const int64_t n = c.B * c.T * c.Hq * c.D, nl = c.B * c.Hq * c.T;
  const float nan = std::nanf("");
  Dev<float> x(randn(n, 21)), out(FVec(n, nan)), lse(FVec(nl, nan));
  attention_forward(x, x, x, out, lse, c.shape());
  for (float e : out.host()) EXPECT_EQ(e, 0.0f);
  for (float e : lse.host()) EXPECT_EQ(e, -INFINITY);
}

class CudaAttentionLimits : public CudaTest {};

TEST_F(CudaAttentionLimits, LongSequenceNeedsNoTxTMemory) {
  // T = 8192: a T x T score matrix would be 256 MiB. The kernels' only temporary is Dvec
  // (B Hq T floats) in the context's scratch, whose floor is 1 MiB.
  const Case c{1, 8192, 2, 1, 64};
  const AttnShape s = c.shape();
  const FVec q = randn(c.q_size(), 5), k = randn(c.kv_size(), 6), v = randn(c.kv_size(), 7);
  const FVec dout = randn(c.q_size(), 8);
  Dev<float> dQ(q), dK(k), dV(v), dO(dout), dOut{size_t(c.q_size())}, dLse{size_t(c.lse_size())};
  Dev<float> gQ{size_t(c.q_size())}, gK{size_t(c.kv_size())}, gV{size_t(c.kv_size())};
  const size_t before = ctx().pool().live_total();
  attention_forward(dQ, dK, dV, dOut, dLse, s);
  attention_backward(dO, dQ, dK, dV, dOut, dLse, gQ, gK, gV, s);
  ctx().synchronize();
  EXPECT_LE(ctx().pool().live_total() - before, size_t(1) << 20);
  // And the forward against the CPU's.
  FVec out(c.q_size()), lse(c.lse_size());
  attention_forward(host(q), host(k), host(v), host(out), host(lse), s);
  expect_normwise(dOut.host(), out, kRel, "out, T = 8192");
  expect_normwise(dLse.host(), lse, kRel, "lse, T = 8192");
}

TEST_F(CudaAttentionLimits, HeadDimAbove128IsAnError) {
  const Case c{1, 4, 1, 1, 256};
  Dev<float> x{size_t(c.q_size())}, lse{size_t(c.lse_size())};
  EXPECT_THROW(attention_forward(x, x, x, x, lse, c.shape()), Error);
}

}  // namespace
}  // namespace tessera::kernels
