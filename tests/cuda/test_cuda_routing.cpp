// The mixture-of-experts routing kernels (kernels::moe_*) on a GPU against the CPU instance of
// the same source on the same inputs. Integer results (choices, loads, packed rows, offsets)
// must be equal; selection runs on the CPU's scores copied to the device, so ties are the same
// ties. Floating-point results: 1e-5 (cuda_test_util.hpp; the device's exp and log differ from
// the host's by an ulp or so), the copies exact. Skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"

namespace tessera::kernels {
namespace {

using namespace test_cuda;
using IVec = std::vector<int32_t>;
using tessera::test::tied;
using DVec = std::vector<double>;

class CudaRouting : public CudaTest {};

Tensor h64(const DVec& v) {
  return view_of(v.data(), Shape{int64_t(v.size())});
}
FVec to_f(const DVec& v) {
  return FVec(v.begin(), v.end());
}

TEST_F(CudaRouting, ScoresMatchCpu) {
  const int64_t N = 300, E = 16;
  for (bool sigmoid : {false, true}) {
    const FVec l = randn(N * E, 1, 3.0);
    FVec s(size_t(N * E));
    DVec lse(static_cast<size_t>(N)), norm(static_cast<size_t>(N));
    moe_scores(host(l), host(s), h64(lse), h64(norm), N, E, sigmoid);
    Dev<float> dl(l), ds(size_t(N * E));
    Dev<double> dlse(static_cast<size_t>(N)), dnorm(static_cast<size_t>(N));
    moe_scores(dl, ds, dlse, dnorm, N, E, sigmoid);
    expect_close(ds.host(), s, kRel, "scores");
    expect_close(to_f(dlse.host()), to_f(lse), kRel, "lse");
    expect_close(to_f(dnorm.host()), to_f(norm), kRel, "norm");
  }
}

TEST_F(CudaRouting, TopKAndNodeLimitsMatchCpuExactly) {
  const int64_t N = 257, E = 32, K = 6;
  for (int levels : {3, 1000})
    for (auto [G, M] : {std::pair<int64_t, int64_t>{1, 0}, {4, 2}, {8, 3}}) {
      const FVec s = tied(N * E, uint32_t(levels + G), levels), bias = randn(E, 2, 0.05);
      IVec c(size_t(N * K));
      FVec w(size_t(N * K));
      moe_top_k(host(s), host(bias), host(c), host(w), N, E, K, G, M, true);
      Dev<float> ds(s), db(bias), dw(size_t(N * K));
      Dev<int32_t> dc(size_t(N * K));
      moe_top_k(ds, db, dc, dw, N, E, K, G, M, true);
      const std::string what = "levels " + std::to_string(levels) + " G " + std::to_string(G);
      EXPECT_EQ(dc.host(), c) << what;
      expect_close(dw.host(), w, kRel, what + " weights");
    }
}

TEST_F(CudaRouting, CapacityPackAndStatsMatchCpuExactly) {
  const int64_t B = 3, T = 64, E = 8, K = 2, N = B * T, cap = 12, r0 = 50, R = 100;
  const FVec s = tied(N * E, 7, 4), bias(size_t(E), 0.0f);
  IVec choice(size_t(N * K));
  moe_top_k(host(s), host(bias), host(choice), Tensor{}, N, E, K, 1, 0, false);
  IVec load(size_t(B * E)), kept(load.size()), row(size_t(N * K)), offset(size_t(E + 1));
  moe_capacity(host(choice), host(load), host(kept), host(row), B, T, K, E, cap, r0, R);
  moe_pack(host(choice), host(kept), host(offset), host(row), B, T, K, E);
  FVec f(size_t(B * E));
  DVec aux(size_t(B * E)), lse(size_t(N), 1.5), stats(size_t(E + 4));
  moe_balance(host(s), Tensor{}, host(load), host(f), h64(aux), B, T, K, E);
  moe_route_stats(h64(lse), host(load), h64(aux), host(choice), h64(stats), B, T, K, E, cap, 1.0,
                  2.0, r0, R, 2, 4);
  Dev<int32_t> dchoice(choice), dload(load.size()), dkept(kept.size()), drow(row.size()),
      doffset(offset.size());
  Dev<float> dscores(s), df(f.size());
  Dev<double> daux(aux.size()), dlse(lse), dstats(stats.size());
  moe_capacity(dchoice, dload, dkept, drow, B, T, K, E, cap, r0, R);
  moe_pack(dchoice, dkept, doffset, drow, B, T, K, E);
  moe_balance(dscores, Tensor{}, dload, df, daux, B, T, K, E);
  moe_route_stats(dlse, dload, daux, dchoice, dstats, B, T, K, E, cap, 1.0, 2.0, r0, R, 2, 4);
  EXPECT_EQ(dload.host(), load);
  EXPECT_EQ(dkept.host(), kept);
  EXPECT_EQ(drow.host(), row);
  EXPECT_EQ(doffset.host(), offset);
  expect_bitwise(df.host(), f, "f");
  expect_close(to_f(daux.host()), to_f(aux), kRel, "aux terms");
  expect_close(to_f(dstats.host()), to_f(stats), kRel, "stats");
}

TEST_F(CudaRouting, GatherCombineBackwardMatchCpu) {
  const int64_t B = 2, T = 40, E = 8, K = 2, N = B * T, C = 96, r0 = 10, R = 60;
  const FVec s = randn(N * E, 3), bias(size_t(E), 0.0f);
  IVec choice(size_t(N * K)), load(size_t(B * E)), kept(load.size()), row(size_t(N * K)),
      offset(size_t(E + 1));
  FVec w(size_t(N * K));
  moe_top_k(host(s), host(bias), host(choice), host(w), N, E, K, 1, 0, false);
  moe_capacity(host(choice), host(load), host(kept), host(row), B, T, K, E, 9, r0, R);
  moe_pack(host(choice), host(kept), host(offset), host(row), B, T, K, E);
  const FVec x = randn(N * C, 4), out = randn(N * K * C, 5), y0 = randn(N * C, 6),
             dy = randn(N * C, 7);
  FVec packed(size_t(N * K * C)), y = y0, dpk(size_t(N * K * C)), dw(size_t(N * K));
  moe_gather(host(x), host(row), host(packed), r0, R, K, C);
  moe_combine(host(out), host(row), host(w), host(y), r0, R, 0, K, C);
  moe_combine_backward(host(dy), host(out), host(row), host(w), host(dpk), host(dw), r0, R, 0, K,
                       C);
  Dev<float> dx(x), dout(out), dyv(y0), ddy(dy), dpacked(packed.size()), ddpk(dpk.size()),
      ddw(dw.size()), dwt(w);
  Dev<int32_t> drow(row);
  moe_gather(dx, drow, dpacked, r0, R, K, C);
  moe_combine(dout, drow, dwt, dyv, r0, R, 0, K, C);
  moe_combine_backward(ddy, dout, drow, dwt, ddpk, ddw, r0, R, 0, K, C);
  expect_bitwise(dpacked.host(), packed, "gather");
  expect_close(dyv.host(), y, kRel, "combine");
  expect_close(ddpk.host(), dpk, kRel, "d_packed");
  expect_close(ddw.host(), dw, kRel, "dweight");
}

TEST_F(CudaRouting, RouterBackwardMatchesCpu) {
  const int64_t B = 2, T = 30, E = 16, K = 4, N = B * T, r0 = 7, R = 40;
  for (bool sigmoid : {false, true}) {
    const FVec l = randn(N * E, 8, 1.5), bias(size_t(E), 0.0f);
    FVec s(size_t(N * E)), w(size_t(N * K));
    DVec lse(static_cast<size_t>(N));
    IVec choice(size_t(N * K));
    moe_scores(host(l), host(s), h64(lse), Tensor{}, N, E, sigmoid);
    moe_top_k(host(s), host(bias), host(choice), host(w), N, E, K, 1, 0, sigmoid);
    const FVec dw = randn(N * K, 9), f = randn(B * E, 10, 1.0, 1.0);
    FVec dl(size_t(R * E));
    moe_router_backward(host(l), host(s), host(choice), host(w), host(dw), host(f), host(dl), r0, R,
                        T, E, K, sigmoid, 0.01, 0.002);
    Dev<float> dlg(l), ds(s), dwt(w), ddw(dw), df(f), ddl(dl.size());
    Dev<int32_t> dc(choice);
    moe_router_backward(dlg, ds, dc, dwt, ddw, df, ddl, r0, R, T, E, K, sigmoid, 0.01, 0.002);
    expect_close(ddl.host(), dl, kRel, sigmoid ? "sigmoid" : "softmax");
  }
}

}  // namespace
}  // namespace tessera::kernels
