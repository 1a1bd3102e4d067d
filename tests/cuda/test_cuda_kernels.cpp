// CUDA kernels against the CPU reference on the same inputs (GEMM and attention are in their own
// files). Needs a GPU: without one every test is reported as skipped (label cuda), and the
// device checks run on a GPU machine (bench/gpu-check). Tolerances: cuda_test_util.hpp.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/error.hpp"
#include "kernels/cuda/cublas_api.hpp"
#include "cuda_test_util.hpp"

namespace tessera::kernels {
namespace {

using namespace test_cuda;
using IVec = std::vector<int32_t>;

class CudaKernels : public CudaTest {};

IVec random_ids(int64_t n, int32_t lo, int32_t hi, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(lo, hi - 1);
  IVec ids(static_cast<size_t>(n));
  for (auto& x : ids) x = dist(gen);
  return ids;
}

// ---- context, pool, errors ----------------------------------------------------------------------

TEST_F(CudaKernels, ContextPoolChargesWorkspaceAndCachesBlocks) {
  DevicePool& pool = ctx().pool();
  const size_t ws = pool.live(Charge::workspace);
  EXPECT_GE(ws, size_t(32) << 20);  // the cuBLAS workspace
  void* a = pool.allocate(1 << 20, Charge::params);
  EXPECT_EQ(pool.live(Charge::params), size_t(1) << 20);
  const int64_t raw = pool.raw_allocations();
  pool.release(a);
  void* b = pool.allocate(1 << 20, Charge::grads);
  EXPECT_EQ(b, a);  // reused from the cache
  EXPECT_EQ(pool.raw_allocations(), raw);
  pool.release(b);
  Allocator host;
  Allocator alloc(pool, host);
  Buffer buf(alloc, Shape{1000}, DType::f32, Charge::activations);
  EXPECT_EQ(buf.view().space, Space::cuda);
  std::vector<float> h(1000, 1.0f);
  ctx().synchronize();
  ASSERT_EQ(cudaMemcpy(h.data(), buf.ptr_f32(), 4000, cudaMemcpyDeviceToHost), cudaSuccess);
  for (float x : h) EXPECT_EQ(x, 0.0f);  // zero-filled
}

TEST_F(CudaKernels, ErrorsBecomeTesseraErrors) {
  // An impossible allocation: the pool reports the category and the live bytes.
  try {
    ctx().pool().allocate(size_t(1) << 60, Charge::optimizer);
    FAIL() << "expected an out-of-memory error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device out of memory"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("optimizer"), std::string::npos) << e.what();
  }
  // A CUDA failure names the call.
  try {
    cuda::Context bad(cuda::device_count() + 3);
    FAIL() << "expected an invalid-device error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cudaSetDevice"), std::string::npos) << e.what();
    EXPECT_FALSE(e.collective());
  }
  Dev<float> a(16), c(16);
  EXPECT_THROW(matmul(a, a, c, 4, 4, -1, false, false), Error);
}

// cuBLAS is loaded at the first use, not linked (kernels/cuda/cublas_api.hpp): no GPU needed to
// see the library load, every entry point resolve, and a status named through it.
TEST(CudaKernelsNoContext, CublasLoadsOnFirstUse) {
  const cuda::detail::CublasApi& api = cuda::detail::cublas();
  EXPECT_NE(api.create, nullptr);
  EXPECT_NE(api.gemm_ex_64, nullptr);
  EXPECT_STREQ(api.status_name(CUBLAS_STATUS_NOT_INITIALIZED), "CUBLAS_STATUS_NOT_INITIALIZED");
  EXPECT_EQ(&api, &cuda::detail::cublas());  // loaded once
}

TEST(CudaKernelsNoContext, KernelWithoutContextIsAnError) {
  TESSERA_NEED_CUDA_DEVICE();
  float unused = 0;  // never touched: the kernel looks for its context first
  try {
    fill(view_of(&unused, Shape{1}, Space::cuda), 0.0f, 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no current cuda::Context"), std::string::npos);
  }
}

// ---- elementwise ------------------------------------------------------------------------------

TEST_F(CudaKernels, ElementwiseMatchCpuExactly) {
  const int64_t n = 100003, N = 37, C = 129;
  const FVec x = randn(n, 1), y0 = randn(n, 2), b = randn(C, 3), yb = randn(N * C, 4);
  Dev<float> dx(x), dy(y0), dfill{size_t(n)}, dcopy{size_t(n)}, db(b), dyb(yb);
  fill(dfill, 2.5f, n);
  copy(dx, dcopy, n);
  add_inplace(dy, dx, n);
  bias_add(dyb, db, N, C);
  FVec fill_ref(n), copy_ref(n), y_ref = y0, yb_ref = yb;
  fill(host(fill_ref), 2.5f, n);
  copy(host(x), host(copy_ref), n);
  add_inplace(host(y_ref), host(x), n);
  bias_add(host(yb_ref), host(b), N, C);
  expect_bitwise(dfill.host(), fill_ref, "fill");
  expect_bitwise(dcopy.host(), copy_ref, "copy");
  expect_bitwise(dy.host(), y_ref, "add_inplace");
  expect_bitwise(dyb.host(), yb_ref, "bias_add");
  scale_inplace(dy, -0.37f, n);
  scale_inplace(host(y_ref), -0.37f, n);
  expect_bitwise(dy.host(), y_ref, "scale_inplace");
}

TEST_F(CudaKernels, SumSquaresMatchesCpu) {
  for (int64_t n : {1, 1000, 3000017}) {
    const FVec x = randn(n, uint32_t(n));
    Dev<float> dx(x);
    const double want = sum_squares(host(x), n);
    // Both sum in double, in different orders: ~n * 1e-16 relative at worst.
    EXPECT_NEAR(sum_squares(dx, n), want, 1e-10 * want) << n;
    Dev<double> total(std::vector<double>{1.5});
    sum_squares_accumulate(dx, n, total);
    sum_squares_accumulate(dx, n, total);
    EXPECT_NEAR(total.host()[0], 1.5 + 2 * want, 1e-10 * want) << n;
  }
  Dev<float> none{size_t(1)};
  EXPECT_EQ(sum_squares(none, 0), 0.0);
}

TEST_F(CudaKernels, BiasBackwardMatchesCpu) {
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 7}, {300, 129}, {4099, 768}}) {
    const FVec dy = randn(N * C, 5), db0 = randn(C, 6);
    Dev<float> ddy(dy), ddb(db0);
    bias_backward(ddy, ddb, N, C);
    FVec db = db0;
    bias_backward(host(dy), host(db), N, C);
    expect_normwise(ddb.host(), db, kRel, "bias_backward");
  }
}

TEST_F(CudaKernels, Bf16CastsRoundToNearestEven) {
  FVec x = randn(4099, 7, 10.0);
  x[0] = 1.0f + 1.0f / 256;  // halfway between two bf16 values: rounds to the even one, 1.0
  x[1] = std::numeric_limits<float>::infinity();
  x[2] = -0.0f;
  x[3] = std::numeric_limits<float>::max();  // rounds up to infinity
  Dev<float> dx(x), back(x.size());
  Dev<uint16_t> bits(x.size());
  cast(dx, bits.as(DType::bf16), int64_t(x.size()));
  cast(bits.as(DType::bf16), back, int64_t(x.size()));
  const std::vector<uint16_t> got = bits.host();
  const FVec round_trip = back.host();
  for (size_t i = 0; i < x.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &x[i], 4);
    const uint16_t want = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    ASSERT_EQ(got[i], want) << i << ": " << x[i];
    const uint32_t w = uint32_t(want) << 16;
    float f;
    std::memcpy(&f, &w, 4);
    ASSERT_EQ(round_trip[i], f) << i;
  }
  EXPECT_EQ(round_trip[0], 1.0f);
}

// Both 16-bit casts, each way, bit for bit against the CPU backend (which rounds on the bit
// patterns), subnormals and overflow included.
TEST_F(CudaKernels, HalfCastsMatchCpuBitwise) {
  FVec x = randn(5003, 8, 1000.0);
  x[0] = 65520.0f, x[1] = 5.9604645e-08f / 2, x[2] = 1e-6f, x[3] = -1e-7f, x[4] = 1e30f;
  for (DType t : {DType::bf16, DType::f16}) {
    std::vector<uint16_t> want(x.size());
    FVec want_back(x.size());
    cast(host(x), view_of(want.data(), t, Shape{int64_t(x.size())}), int64_t(x.size()));
    cast(view_of(want.data(), t, Shape{int64_t(x.size())}), host(want_back), int64_t(x.size()));
    Dev<float> dx(x), back(x.size());
    Dev<uint16_t> bits(x.size());
    cast(dx, bits.as(t), int64_t(x.size()));
    cast(bits.as(t), back, int64_t(x.size()));
    const std::vector<uint16_t> got = bits.host();
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(got[i], want[i]) << dtype_name(t) << " " << x[i];
    expect_bitwise(back.host(), want_back, dtype_name(t));
  }
}

// ---- normalisation ----------------------------------------------------------------------------

TEST_F(CudaKernels, RmsNormMatchesCpu) {
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 8}, {67, 768}, {513, 2050}}) {
    const FVec x = randn(N * C, 11, 2.0, 0.5), w = randn(C, 12, 0.2, 1.0), dy = randn(N * C, 13);
    const FVec dw0 = randn(C, 14);
    FVec y(N * C), rstd(N), dx(N * C), dw = dw0;
    rmsnorm_forward(host(x), host(w), host(y), host(rstd), N, C, 1e-5f);
    rmsnorm_backward(host(dy), host(x), host(w), host(rstd), host(dx), host(dw), N, C);
    Dev<float> dX(x), dW(w), dY{size_t(N * C)}, dR{size_t(N)}, dDY(dy), dDX{size_t(N * C)},
        dDW(dw0);
    rmsnorm_forward(dX, dW, dY, dR, N, C, 1e-5f);
    rmsnorm_backward(dDY, dX, dW, dR, dDX, dDW, N, C);
    expect_close(dY.host(), y, kRel, "rmsnorm y");
    expect_close(dR.host(), rstd, kRel, "rmsnorm rstd");
    expect_close(dDX.host(), dx, kRel, "rmsnorm dx");
    expect_normwise(dDW.host(), dw, kRel, "rmsnorm dw");
  }
}

TEST_F(CudaKernels, LayerNormMatchesCpu) {
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 8}, {67, 768}, {513, 2050}}) {
    const FVec x = randn(N * C, 21, 2.0, 0.5), w = randn(C, 22, 0.2, 1.0), b = randn(C, 23);
    const FVec dy = randn(N * C, 24), dw0 = randn(C, 25), db0 = randn(C, 26);
    FVec y(N * C), mean(N), rstd(N), dx(N * C), dw = dw0, db = db0;
    layernorm_forward(host(x), host(w), host(b), host(y), host(mean), host(rstd), N, C, 1e-5f);
    layernorm_backward(host(dy), host(x), host(w), host(mean), host(rstd), host(dx), host(dw),
                       host(db), N, C);
    Dev<float> dX(x), dW(w), dB(b), dY{size_t(N * C)}, dM{size_t(N)}, dR{size_t(N)}, dDY(dy),
        dDX{size_t(N * C)}, dDW(dw0), dDB(db0);
    layernorm_forward(dX, dW, dB, dY, dM, dR, N, C, 1e-5f);
    layernorm_backward(dDY, dX, dW, dM, dR, dDX, dDW, dDB, N, C);
    expect_close(dY.host(), y, kRel, "layernorm y");
    expect_close(dM.host(), mean, kRel, "layernorm mean");
    expect_close(dR.host(), rstd, kRel, "layernorm rstd");
    expect_close(dDX.host(), dx, kRel, "layernorm dx");
    expect_normwise(dDW.host(), dw, kRel, "layernorm dw");
    expect_normwise(dDB.host(), db, kRel, "layernorm db");
  }
}

// ---- activations ------------------------------------------------------------------------------

TEST_F(CudaKernels, SwiGluMatchesCpu) {
  const int64_t n = 70001;
  FVec gate = randn(n, 31, 4.0), up = randn(n, 32), dout = randn(n, 33);
  gate[0] = -100.0f, gate[1] = 100.0f, gate[2] = 0.0f;
  FVec out(n), dgate(n), dup(n);
  swiglu_forward(host(gate), host(up), host(out), n);
  swiglu_backward(host(dout), host(gate), host(up), host(dgate), host(dup), n);
  Dev<float> dG(gate), dU(up), dO{size_t(n)}, dD(dout), dDG{size_t(n)}, dDU{size_t(n)};
  swiglu_forward(dG, dU, dO, n);
  swiglu_backward(dD, dG, dU, dDG, dDU, n);
  expect_close(dO.host(), out, kRel, "swiglu out");
  expect_close(dDG.host(), dgate, kRel, "swiglu dgate");
  expect_close(dDU.host(), dup, kRel, "swiglu dup");
}

TEST_F(CudaKernels, GeluMatchesCpu) {
  const int64_t n = 70001;
  FVec x = randn(n, 41, 3.0), dy = randn(n, 42);
  x[0] = -30.0f, x[1] = 30.0f, x[2] = 0.0f;
  FVec y(n), dx(n);
  gelu_forward(host(x), host(y), n);
  gelu_backward(host(dy), host(x), host(dx), n);
  Dev<float> dX(x), dYo{size_t(n)}, dDY(dy), dDX{size_t(n)};
  gelu_forward(dX, dYo, n);
  gelu_backward(dDY, dX, dDX, n);
  expect_close(dYo.host(), y, kRel, "gelu y");
  expect_close(dDX.host(), dx, kRel, "gelu dx");
}

// The fused MLP epilogues: the device against the CPU on the same inputs. The pre-activations
// and column sums as bias_add and bias_backward compare (bitwise, by norm), the activations and
// gradients as the activations above; the 16-bit copies must be the device's own fp32 values
// rounded (as kernels::cast rounds them), whatever those are.
TEST_F(CudaKernels, FusedEpiloguesMatchCpu) {
  const int64_t N = 301, C = 129, n = N * C;
  const FVec x = randn(n, 51, 3.0), u = randn(n, 52), d = randn(n, 53), b = randn(C, 54),
             b2 = randn(C, 55);
  auto rounded = [](const FVec& v) {
    std::vector<uint16_t> r(v.size());
    cast(host(v), view_of(r.data(), DType::bf16, Shape{int64_t(v.size())}), int64_t(v.size()));
    return r;
  };
  {  // GELU forward
    FVec pre = x, act(n);
    gelu_bias_forward(host(pre), host(b), host(act), {}, N, C);
    Dev<float> dpre(x), dact{size_t(n)}, db(b);
    Dev<uint16_t> d16{size_t(n)};
    gelu_bias_forward(dpre, db, dact, d16.as(DType::bf16), N, C);
    expect_bitwise(dpre.host(), pre, "gelu_bias_forward pre");
    const FVec got = dact.host();
    expect_close(got, act, kRel, "gelu_bias_forward act");
    EXPECT_EQ(d16.host(), rounded(got)) << "gelu_bias_forward act16";
  }
  {  // GELU backward with the bias gradient
    FVec dpre(n), dbias = b;
    gelu_bias_backward(host(d), host(x), host(dpre), {}, host(dbias), N, C);
    Dev<float> dd(d), dx(x), ddpre{size_t(n)}, ddb(b);
    Dev<uint16_t> d16{size_t(n)};
    gelu_bias_backward(dd, dx, ddpre, d16.as(DType::bf16), ddb, N, C);
    const FVec got = ddpre.host();
    expect_close(got, dpre, kRel, "gelu_bias_backward dpre");
    EXPECT_EQ(d16.host(), rounded(got)) << "gelu_bias_backward dpre16";
    expect_normwise(ddb.host(), dbias, kRel, "gelu_bias_backward dbias");
  }
  {  // SwiGLU forward and backward with biases
    FVec gate = x, up = u, act(n), dgate(n), dup(n), dgb = b, dub = b2;
    swiglu_bias_forward(host(gate), host(up), host(b), host(b2), host(act), {}, N, C);
    swiglu_bias_backward(host(d), host(gate), host(up), host(dgate), host(dup), {}, {}, host(dgb),
                         host(dub), N, C);
    Dev<float> dG(x), dU(u), dA{size_t(n)}, dB(b), dB2(b2), dD(d), dDG{size_t(n)},
        dDU{size_t(n)}, dGB(b), dUB(b2);
    swiglu_bias_forward(dG, dU, dB, dB2, dA, {}, N, C);
    swiglu_bias_backward(dD, dG, dU, dDG, dDU, {}, {}, dGB, dUB, N, C);
    expect_bitwise(dG.host(), gate, "swiglu_bias_forward gate");
    expect_bitwise(dU.host(), up, "swiglu_bias_forward up");
    expect_close(dA.host(), act, kRel, "swiglu_bias_forward act");
    expect_close(dDG.host(), dgate, kRel, "swiglu_bias_backward dgate");
    expect_close(dDU.host(), dup, kRel, "swiglu_bias_backward dup");
    expect_normwise(dGB.host(), dgb, kRel, "swiglu_bias_backward dgate_bias");
    expect_normwise(dUB.host(), dub, kRel, "swiglu_bias_backward dup_bias");
  }
  {  // the 16-bit-only forms a bf16 run uses: act16 without act, the norms' bf16 outputs
    Dev<float> dG(x), dU(u), dB(b), dB2(b2), dW(b2), dR{size_t(N)}, dM{size_t(N)}, dY{size_t(n)};
    Dev<uint16_t> a16{size_t(n)}, y16{size_t(n)};
    swiglu_bias_forward(dG, dU, dB, dB2, {}, a16.as(DType::bf16), N, C);
    FVec gate = x, up = u, act(n);
    swiglu_bias_forward(host(gate), host(up), host(b), host(b2), host(act), {}, N, C);
    const std::vector<uint16_t> want = rounded(act), got = a16.host();
    int64_t off = 0;  // a bf16 ulp apart at most (the device's own fp32 act rounds so)
    for (int64_t i = 0; i < n; ++i) off += std::abs(int(got[size_t(i)]) - int(want[size_t(i)])) > 1;
    EXPECT_EQ(off, 0) << "swiglu_bias_forward act16 only";
    rmsnorm_forward(dG, dW, dY, dR, N, C, 1e-5f);
    rmsnorm_forward(dG, dW, y16.as(DType::bf16), dR, N, C, 1e-5f);
    EXPECT_EQ(y16.host(), rounded(dY.host())) << "rmsnorm_forward bf16 y";
    layernorm_forward(dG, dW, dB, dY, dM, dR, N, C, 1e-5f);
    layernorm_forward(dG, dW, dB, y16.as(DType::bf16), dM, dR, N, C, 1e-5f);
    EXPECT_EQ(y16.host(), rounded(dY.host())) << "layernorm_forward bf16 y";
  }
}

// ---- rope -------------------------------------------------------------------------------------

TEST_F(CudaKernels, RopeMatchesCpuForwardAndInverse) {
  const int64_t B = 2, T = 300, H = 3, D = 64, pos0 = 3900;  // positions up to 4199
  const FVec x = randn(B * T * H * D, 51);
  for (bool inverse : {false, true}) {
    FVec want = x;
    rope(host(want), B, T, H, D, pos0, 10000.0f, inverse);
    Dev<float> dx(x);
    rope(dx, B, T, H, D, pos0, 10000.0f, inverse);
    expect_close(dx.host(), want, kRel, inverse ? "rope inverse" : "rope");
  }
}

// ---- embedding --------------------------------------------------------------------------------

TEST_F(CudaKernels, EmbeddingMatchesCpuBitwise) {
  const int64_t V = 300, C = 72, N = 2000;  // many repeated ids
  const IVec ids = random_ids(N, 0, int32_t(V), 61);
  const FVec table = randn(V * C, 62), dout = randn(N * C, 63), dtable0 = randn(V * C, 64);
  FVec out(N * C), dtable = dtable0;
  embedding_forward(host(ids), host(table), host(out), N, C);
  embedding_backward(host(ids), host(dout), host(dtable), N, C);
  Dev<int32_t> dI(ids);
  Dev<float> dT(table), dO{size_t(N * C)}, dD(dout), dDT(dtable0);
  embedding_forward(dI, dT, dO, N, C);
  embedding_backward(dI, dD, dDT, N, C);
  expect_bitwise(dO.host(), out, "embedding out");
  // Rows added in token order, as on the CPU: the same sums, bit for bit.
  expect_bitwise(dDT.host(), dtable, "embedding dtable");
}

TEST_F(CudaKernels, VocabParallelEmbeddingMatchesCpuBitwise) {
  const int64_t V = 1000, C = 40, N = 3001, v0 = 400, rows = 250;
  const IVec ids = random_ids(N, 0, int32_t(V), 71);
  const FVec table = randn(rows * C, 72), dout = randn(N * C, 73), dtable0 = randn(rows * C, 74);
  FVec out(N * C, -1.0f), dtable = dtable0;
  embedding_forward_range(host(ids), host(table), host(out), N, C, v0, rows);
  embedding_backward_range(host(ids), host(dout), host(dtable), N, C, v0, rows);
  Dev<int32_t> dI(ids);
  Dev<float> dT(table), dO(FVec(N * C, -1.0f)), dD(dout), dDT(dtable0);
  embedding_forward_range(dI, dT, dO, N, C, v0, rows);
  embedding_backward_range(dI, dD, dDT, N, C, v0, rows);
  expect_bitwise(dO.host(), out, "embedding_range out");
  expect_bitwise(dDT.host(), dtable, "embedding_range dtable");
}

// ---- cross-entropy ----------------------------------------------------------------------------

TEST_F(CudaKernels, CrossEntropyFusedMatchesCpu) {
  const int64_t N = 37, V = 50304, V_valid = 50257;
  const FVec logits = randn(N * V, 81, 3.0);
  IVec targets = random_ids(N, 0, int32_t(V_valid), 82);
  targets[3] = targets[20] = -1;  // masked (doc/data.md, "Loss masks"): loss 0, gradient 0
  FVec grad = logits, losses(N);
  cross_entropy_fused(host(grad), host(targets), host(losses), N, V, V_valid, 0.01f);
  Dev<float> dL(logits), dLoss{size_t(N)};
  Dev<int32_t> dT(targets);
  cross_entropy_fused(dL, dT, dLoss, N, V, V_valid, 0.01f);
  expect_close(dLoss.host(), losses, kRel, "cross_entropy losses");
  expect_close(dL.host(), grad, kRel, "cross_entropy grad");
}

TEST_F(CudaKernels, VocabParallelCrossEntropyMatchesCpu) {
  // A vocabulary of 1200 split over two "ranks" of 640 columns each, the second padded. The
  // CPU runs both shards through the three passes, the host standing in for the all-reduces;
  // the GPU then runs each shard's passes on the same inputs.
  const int64_t N = 29, V = 640, V_total = 1200;
  const FVec logits = randn(N * 2 * V, 91, 2.0);
  IVec targets = random_ids(N, 0, int32_t(V_total), 92);
  targets[5] = targets[28] = -1;  // masked
  struct Shard {
    int64_t v0, V_valid;
    FVec logits, row_max, target_logit, grad, losses;
    std::vector<double> sum_exp;
  };
  Shard sh[2];
  FVec gmax(N, -std::numeric_limits<float>::infinity()), gtl(N, 0.0f);
  std::vector<double> gsum(N, 0.0);
  for (int r = 0; r < 2; ++r) {
    Shard& s = sh[r];
    s.v0 = r * V;
    s.V_valid = std::min<int64_t>(V, V_total - s.v0);
    s.logits.resize(N * V);
    for (int64_t n = 0; n < N; ++n)
      std::copy_n(logits.begin() + n * 2 * V + s.v0, V, s.logits.begin() + n * V);
    s.row_max.resize(N);
    cross_entropy_local_max(host(s.logits), host(s.row_max), N, V, s.V_valid);
    for (int64_t n = 0; n < N; ++n) gmax[n] = std::max(gmax[n], s.row_max[n]);
  }
  for (Shard& s : sh) {
    s.grad = s.logits;
    s.sum_exp.resize(N);
    s.target_logit.resize(N);
    cross_entropy_local_exp(host(s.grad), host(targets), host(gmax), host(s.sum_exp),
                            host(s.target_logit), N, V, s.V_valid, s.v0);
    for (int64_t n = 0; n < N; ++n) gsum[n] += s.sum_exp[n], gtl[n] += s.target_logit[n];
  }
  for (Shard& s : sh) {
    s.losses.resize(N);
    cross_entropy_local_finish(host(s.grad), host(targets), host(gsum), host(gtl), host(s.losses),
                               N, V, s.V_valid, s.v0, 0.5f);
  }

  for (const Shard& s : sh) {
    Dev<float> dL(s.logits), dMax{size_t(N)}, dGmax(gmax), dTl{size_t(N)}, dGtl(gtl),
        dLoss{size_t(N)};
    Dev<double> dSum{size_t(N)}, dGsum(gsum);
    Dev<int32_t> dT(targets);
    cross_entropy_local_max(dL, dMax, N, V, s.V_valid);
    expect_bitwise(dMax.host(), s.row_max, "local_max");
    cross_entropy_local_exp(dL, dT, dGmax, dSum, dTl, N, V, s.V_valid, s.v0);
    const std::vector<double> got_sum = dSum.host();
    for (int64_t n = 0; n < N; ++n) EXPECT_NEAR(got_sum[n], s.sum_exp[n], 1e-6 * gsum[n]) << n;
    expect_bitwise(dTl.host(), s.target_logit, "local_exp target_logit");
    cross_entropy_local_finish(dL, dT, dGsum, dGtl, dLoss, N, V, s.V_valid, s.v0, 0.5f);
    expect_close(dLoss.host(), s.losses, kRel, "local_finish losses");
    expect_close(dL.host(), s.grad, kRel, "local_finish grad");
  }
}

TEST_F(CudaKernels, VocabularyTileCrossEntropyMatchesCpu) {
  // The output head's tiles (OutputHead::head_chunk_tiled): 1100 real columns in tiles of 256
  // (the last 76 wide), the statistics along them, the losses, then each tile's bf16 gradient,
  // on the CPU and on the GPU from the same inputs; then the vocabulary-parallel rescale.
  const int64_t N = 29, V = 1100, T = 256;
  const FVec logits = randn(N * V, 93, 2.0);
  IVec targets = random_ids(N, 0, int32_t(V), 94);
  targets[4] = -1;  // masked
  const auto tile = [&](int64_t c, int64_t t) {
    FVec out(N * t);
    for (int64_t n = 0; n < N; ++n) std::copy_n(logits.begin() + n * V + c, t, out.begin() + n * t);
    return out;
  };
  FVec mx(N), tl(N), losses(N);
  std::vector<double> sum(N);
  Dev<float> dMx{size_t(N)}, dTl{size_t(N)}, dLoss{size_t(N)};
  Dev<double> dSum{size_t(N)};
  Dev<int32_t> dT(targets);
  for (int64_t c = 0; c < V; c += T) {
    const int64_t t = std::min(T, V - c);
    const FVec l = tile(c, t);
    cross_entropy_tile_stats(host(l), host(targets), host(mx), host(sum), host(tl), N, t, c, c == 0);
    Dev<float> dL(l);
    cross_entropy_tile_stats(dL, dT, dMx, dSum, dTl, N, t, c, c == 0);
  }
  expect_bitwise(dMx.host(), mx, "tile_stats row_max");
  expect_bitwise(dTl.host(), tl, "tile_stats target_logit");
  const std::vector<double> got_sum = dSum.host();
  for (int64_t n = 0; n < N; ++n) EXPECT_NEAR(got_sum[n], sum[n], 1e-6 * sum[n]) << n;
  Dev<double> dSumCpu(sum);
  cross_entropy_tile_loss(host(targets), host(mx), host(sum), host(tl), host(losses), N);
  cross_entropy_tile_loss(dT, dMx, dSumCpu, dTl, dLoss, N);
  expect_close(dLoss.host(), losses, kRel, "tile_loss");
  for (int64_t c = 0; c < V; c += T) {
    const int64_t t = std::min(T, V - c);
    FVec g = tile(c, t);
    cross_entropy_tile_grad(host(g), host(targets), host(mx), host(sum), N, t, c, 0.5f);
    Dev<float> dL(tile(c, t));
    cross_entropy_tile_grad(dL, dT, dMx, dSumCpu, N, t, c, 0.5f);
    expect_close(dL.host(), g, kRel, "tile_grad tile " + std::to_string(c));
  }
  // The rescale to a larger maximum.
  FVec bigger = mx;
  for (float& m : bigger) m += 1.5f;
  std::vector<double> moved = sum;
  cross_entropy_rescale(host(moved), host(mx), host(bigger), N);
  Dev<float> dBig(bigger);
  cross_entropy_rescale(dSumCpu, dMx, dBig, N);
  const std::vector<double> got_moved = dSumCpu.host();
  for (int64_t n = 0; n < N; ++n) EXPECT_NEAR(got_moved[n], moved[n], 1e-12 * moved[n]) << n;
}

// ---- optimizer --------------------------------------------------------------------------------

TEST_F(CudaKernels, AdamWMatchesCpu) {
  const int64_t n = 100003;
  FVec p = randn(n, 101), g = randn(n, 102), m = randn(n, 103, 0.1), v = randn(n, 104);
  for (float& x : v) x = std::abs(x);
  Dev<float> dp(p), dg(g), dm(m), dv(v);
  const AdamWArgs args{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3, 0.5f};
  adamw(host(p), host(g), host(m), host(v), n, args);
  adamw(dp, dg, dm, dv, n, args);
  expect_close(dp.host(), p, kRel, "adamw p");
  expect_close(dm.host(), m, kRel, "adamw m");
  expect_close(dv.host(), v, kRel, "adamw v");
}

}  // namespace
}  // namespace tessera::kernels
