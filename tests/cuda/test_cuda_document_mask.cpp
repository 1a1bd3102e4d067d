// The CUDA attention kernels with document starts (kernels.hpp, doc_start) against the CPU ones
// on the same inputs, norm-wise within 1e-5 (cuda_test_util.hpp): whole sequences with short
// documents (skipped key tiles, a one-token document, GQA, MQA, padded head dims), and context
// parallelism's blocks (q_pos0, k_pos0) whose rows' documents start in an earlier block. The
// per-token RoPE (kernels::rope_at) is checked against its CPU instance the same way.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cuda_test_util.hpp"

namespace tessera::kernels {
namespace {

using namespace test_cuda;

// [B, T] starts of the documents of rows at global positions q_pos0 .. q_pos0 + T - 1, from
// each sequence's list of document starts (beginning with 0).
std::vector<int32_t> doc_starts(int64_t B, int64_t T, int64_t q_pos0,
                                const std::vector<std::vector<int32_t>>& starts) {
  std::vector<int32_t> doc(size_t(B * T));
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<int32_t>& s = starts[size_t(b) % starts.size()];
    for (int64_t i = 0; i < T; ++i) {
      int32_t d = 0;
      for (int32_t x : s)
        if (x <= q_pos0 + i) d = x;
      doc[size_t(b * T + i)] = d;
    }
  }
  return doc;
}

struct DocCase {
  int64_t B, T, Tk, Hq, Hkv, D, q_pos0, k_pos0;
  std::vector<std::vector<int32_t>> starts;
  AttnShape shape() const {
    return {B, T, Hq, Hkv, D, float(1.0 / std::sqrt(double(D))), Tk, q_pos0, k_pos0};
  }
};

class CudaDocumentMask : public CudaTest, public ::testing::WithParamInterface<DocCase> {};

TEST_P(CudaDocumentMask, ForwardAndBackwardMatchCpu) {
  const DocCase& c = GetParam();
  const AttnShape s = c.shape();
  const int64_t nq = c.B * c.T * c.Hq * c.D, nkv = c.B * c.Tk * c.Hkv * c.D, nl = c.B * c.Hq * c.T;
  const FVec q = randn(nq, 21), k = randn(nkv, 22), v = randn(nkv, 23), dout = randn(nq, 24);
  const std::vector<int32_t> doc = doc_starts(c.B, c.T, c.q_pos0, c.starts);
  FVec out(nq), lse(nl), dq(nq), dk(nkv), dv(nkv);
  attention_forward(host(q), host(k), host(v), host(out), host(lse), s, host(doc));
  attention_backward(host(dout), host(q), host(k), host(v), host(out), host(lse), host(dq),
                     host(dk), host(dv), s, host(doc));
  const float nan = std::nanf("");
  Dev<float> dQ(q), dK(k), dV(v), dO(dout), dOut(FVec(nq, nan)), dLse(FVec(nl, nan));
  Dev<float> gQ(FVec(nq, nan)), gK(FVec(nkv, nan)), gV(FVec(nkv, nan));
  Dev<int32_t> dDoc(doc);
  attention_forward(dQ, dK, dV, dOut, dLse, s, dDoc);
  attention_backward(dO, dQ, dK, dV, dOut, dLse, gQ, gK, gV, s, dDoc);
  expect_normwise(dOut.host(), out, kRel, "out");
  expect_normwise(gQ.host(), dq, kRel, "dq");
  expect_normwise(gK.host(), dk, kRel, "dk");
  expect_normwise(gV.host(), dv, kRel, "dv");
  // lse: equal where finite, -inf (a row that sees no key of the block) on both.
  const FVec l = dLse.host();
  for (size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(lse[i])) {
      EXPECT_TRUE(std::isinf(l[i]) && l[i] < 0) << i;
    } else {
      EXPECT_NEAR(l[i], lse[i], 1e-5 * (1 + std::abs(lse[i]))) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Documents, CudaDocumentMask,
    ::testing::Values(
        DocCase{2, 30, 30, 4, 2, 16, 0, 0, {{0, 3, 4, 11, 25}, {0, 17}}},
        DocCase{2, 200, 200, 4, 1, 16, 0, 0, {{0, 5, 6, 40, 70, 150, 199}, {0, 64, 128}}},
        DocCase{1, 260, 260, 2, 1, 80, 0, 0, {{0, 9, 20, 33, 60, 66, 90, 131, 140, 192, 250}}},
        // Blocks: queries at 128..191 against keys 0..127 (tile 0 before every document).
        DocCase{1, 64, 128, 2, 2, 32, 128, 0, {{0, 100}}},
        // Queries at 96..159 against keys 32..95: some rows see none (lse -inf).
        DocCase{2, 64, 64, 4, 2, 64, 96, 32, {{0, 50, 120}, {0, 90}}}),
    [](const ::testing::TestParamInfo<DocCase>& info) {
      return "case" + std::to_string(info.index);
    });

TEST_F(CudaTest, RopeAtMatchesCpu) {
  const int64_t N = 37, H = 3, D = 8;
  const FVec x = randn(N * H * D, 31);
  std::vector<int32_t> pos(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) pos[size_t(n)] = int32_t((n * 7) % 11);
  for (bool inverse : {false, true}) {
    FVec cpu = x;
    rope_at(host(cpu), host(pos), N, H, D, 10000.0f, inverse);
    Dev<float> gx(x);
    Dev<int32_t> gp(pos);
    rope_at(gx, gp, N, H, D, 10000.0f, inverse);
    expect_normwise(gx.host(), cpu, kRel, "rope_at");
  }
}

}  // namespace
}  // namespace tessera::kernels
