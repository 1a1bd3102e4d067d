// The fused MLP epilogues (kernels::gelu_bias_forward and the others): against plain loops in
// double, and against the unfused kernels they replace (bias_add, the activation, cast,
// bias_backward), which they must match bit for bit. Also the norms' 16-bit outputs, the cast
// of their fp32 ones.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "tensor/half.hpp"
#include "../test_vectors.hpp"

namespace tessera::kernels {
namespace {

using test::FVec;
using test::host;
using test::randn;
using DVec = std::vector<double>;
using HVec = std::vector<uint16_t>;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

Tensor half_view(HVec& v, DType t) {
  return view_of(v.data(), t, Shape{int64_t(v.size())});
}
uint16_t rounded(float x, DType t) {
  return t == DType::bf16 ? half::to_bf16(x) : half::to_f16(x);
}
std::string where(const char* what, int64_t N, int64_t C, size_t i) {
  return std::string(what) + " N=" + std::to_string(N) + " C=" + std::to_string(C) + " [" +
         std::to_string(i) + "]";
}
// Every element identical bit for bit (NaN-free inputs; also tells -0 from +0).
void expect_bits(const FVec& got, const FVec& want, const char* what, int64_t N, int64_t C) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
        << where(what, N, C, i) << ": " << got[i] << " vs " << want[i];
}
void expect_rounded(const HVec& got, const FVec& want, DType t, const char* what, int64_t N,
                    int64_t C) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(got[i], rounded(want[i], t)) << where(what, N, C, i) << " " << dtype_name(t);
}
void expect_near(const FVec& got, const DVec& want, double rtol, double atol, const char* what,
                 int64_t N, int64_t C) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], rtol * std::abs(want[i]) + atol) << where(what, N, C, i);
}

double gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
double gelu_slope(double x) {
  const double k = std::sqrt(2.0 / M_PI), u = k * (x + 0.044715 * x * x * x);
  const double t = std::tanh(u);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3 * 0.044715 * x * x);
}
double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

// Shapes: one column, a width that is no multiple of the host's vector width (16) or column
// block (128), several column blocks with a ragged last one, and enough rows for several host
// pieces.
struct Case {
  int64_t N, C;
};
const Case kCases[] = {{5, 1}, {37, 19}, {3, 300}, {70, 130}};
const DType kHalves[] = {DType::bf16, DType::f16};

TEST(KokkosEpilogue, GeluForwardIsBiasAddGeluAndCast) {
  for (const Case& k : kCases) {
    const int64_t N = k.N, C = k.C, n = N * C;
    const FVec pre0 = randn(n, 1, 3.0), b = randn(C, 2);
    for (bool bias : {true, false}) {
      // Unfused: bias_add, gelu_forward, cast (the operand of the next GEMM).
      FVec pre_ref = pre0, act_ref(size_t(n), kNaN);
      if (bias) bias_add(host(pre_ref), host(b), N, C);
      gelu_forward(host(pre_ref), host(act_ref), n);
      // Against double: the pre-activation exactly as a float sum, gelu to fp32 accuracy.
      DVec want(static_cast<size_t>(n));
      for (int64_t r = 0; r < N; ++r)
        for (int64_t c = 0; c < C; ++c) {
          const size_t i = size_t(r * C + c);
          const float v = bias ? pre0[i] + b[size_t(c)] : pre0[i];
          ASSERT_EQ(pre_ref[i], v);
          want[i] = gelu(v);
        }
      for (DType t : {DType::f32, DType::bf16, DType::f16}) {
        FVec pre = pre0, act(size_t(n), kNaN);
        HVec act16(t == DType::f32 ? 0 : size_t(n), 0xffff);
        gelu_bias_forward(host(pre), bias ? host(b) : Tensor{}, host(act),
                          t == DType::f32 ? Tensor{} : half_view(act16, t), N, C);
        expect_bits(pre, pre_ref, "gelu pre", N, C);
        expect_bits(act, act_ref, "gelu act", N, C);
        expect_near(act, want, 1e-5, 1e-6, "gelu act vs double", N, C);
        if (t == DType::f32) continue;
        expect_rounded(act16, act_ref, t, "gelu act16", N, C);
        // A 16-bit run keeps only the operand (model/mlp.cpp): the same bits without act.
        FVec pre_only = pre0;
        HVec only16(size_t(n), 0xffff);
        gelu_bias_forward(host(pre_only), bias ? host(b) : Tensor{}, {}, half_view(only16, t), N,
                          C);
        expect_bits(pre_only, pre_ref, "gelu pre (act16 only)", N, C);
        expect_rounded(only16, act_ref, t, "gelu act16 only", N, C);
      }
    }
  }
}

TEST(KokkosEpilogue, SwigluForwardIsBiasAddSwigluAndCast) {
  for (const Case& k : kCases) {
    const int64_t N = k.N, C = k.C, n = N * C;
    const FVec gate0 = randn(n, 3, 4.0), up0 = randn(n, 4), gb = randn(C, 5), ub = randn(C, 6);
    for (bool bias : {true, false}) {
      FVec gate_ref = gate0, up_ref = up0, act_ref(size_t(n), kNaN);
      if (bias) {
        bias_add(host(up_ref), host(ub), N, C);
        bias_add(host(gate_ref), host(gb), N, C);
      }
      swiglu_forward(host(gate_ref), host(up_ref), host(act_ref), n);
      DVec want(static_cast<size_t>(n));
      for (size_t i = 0; i < size_t(n); ++i)
        want[i] = double(gate_ref[i]) * sigmoid(gate_ref[i]) * double(up_ref[i]);
      for (DType t : {DType::f32, DType::bf16, DType::f16}) {
        FVec gate = gate0, up = up0, act(size_t(n), kNaN);
        HVec act16(t == DType::f32 ? 0 : size_t(n), 0xffff);
        swiglu_bias_forward(host(gate), host(up), bias ? host(gb) : Tensor{},
                            bias ? host(ub) : Tensor{}, host(act),
                            t == DType::f32 ? Tensor{} : half_view(act16, t), N, C);
        expect_bits(gate, gate_ref, "swiglu gate", N, C);
        expect_bits(up, up_ref, "swiglu up", N, C);
        expect_bits(act, act_ref, "swiglu act", N, C);
        expect_near(act, want, 1e-5, 1e-6, "swiglu act vs double", N, C);
        if (t == DType::f32) continue;
        expect_rounded(act16, act_ref, t, "swiglu act16", N, C);
        FVec gate_only = gate0, up_only = up0;
        HVec only16(size_t(n), 0xffff);
        swiglu_bias_forward(host(gate_only), host(up_only), bias ? host(gb) : Tensor{},
                            bias ? host(ub) : Tensor{}, {}, half_view(only16, t), N, C);
        expect_bits(gate_only, gate_ref, "swiglu gate (act16 only)", N, C);
        expect_bits(up_only, up_ref, "swiglu up (act16 only)", N, C);
        expect_rounded(only16, act_ref, t, "swiglu act16 only", N, C);
      }
    }
  }
}

TEST(KokkosEpilogue, GeluBackwardIsGeluBackwardBiasBackwardAndCast) {
  for (const Case& k : kCases) {
    const int64_t N = k.N, C = k.C, n = N * C;
    const FVec pre = randn(n, 7, 3.0), dact = randn(n, 8), db0 = randn(C, 9);
    // Unfused: gelu_backward, bias_backward (column sums of the fp32 gradient), cast.
    FVec dpre_ref(size_t(n), kNaN), db_ref = db0;
    gelu_backward(host(dact), host(pre), host(dpre_ref), n);
    bias_backward(host(dpre_ref), host(db_ref), N, C);
    DVec want(static_cast<size_t>(n)), db_want(db0.begin(), db0.end());
    for (int64_t r = 0; r < N; ++r)
      for (int64_t c = 0; c < C; ++c) {
        const size_t i = size_t(r * C + c);
        want[i] = double(dact[i]) * gelu_slope(pre[i]);
        db_want[size_t(c)] += want[i];
      }
    for (bool bias : {true, false})
      for (DType t : {DType::f32, DType::bf16, DType::f16}) {
        // fp32 runs take the f32 gradient; 16-bit runs the 16-bit one alone.
        FVec dpre(size_t(n), kNaN), db = db0;
        HVec dpre16(t == DType::f32 ? 0 : size_t(n), 0xffff);
        gelu_bias_backward(host(dact), host(pre), t == DType::f32 ? host(dpre) : Tensor{},
                           t == DType::f32 ? Tensor{} : half_view(dpre16, t),
                           bias ? host(db) : Tensor{}, N, C);
        if (t == DType::f32) {
          expect_bits(dpre, dpre_ref, "gelu dpre", N, C);
          expect_near(dpre, want, 1e-5, 1e-6, "gelu dpre vs double", N, C);
        } else {
          expect_rounded(dpre16, dpre_ref, t, "gelu dpre16", N, C);
        }
        if (bias) {
          expect_bits(db, db_ref, "gelu dbias", N, C);
          expect_near(db, db_want, 1e-5, 1e-5, "gelu dbias vs double", N, C);
        } else {
          expect_bits(db, db0, "gelu dbias untouched", N, C);
        }
      }
    // Both outputs at once.
    FVec dpre(size_t(n), kNaN);
    HVec dpre16(size_t(n), 0xffff);
    gelu_bias_backward(host(dact), host(pre), host(dpre), half_view(dpre16, DType::bf16), {}, N,
                       C);
    expect_bits(dpre, dpre_ref, "gelu dpre (with dpre16)", N, C);
    expect_rounded(dpre16, dpre_ref, DType::bf16, "gelu dpre16 (with dpre)", N, C);
  }
}

TEST(KokkosEpilogue, SwigluBackwardIsSwigluBackwardBiasBackwardAndCast) {
  for (const Case& k : kCases) {
    const int64_t N = k.N, C = k.C, n = N * C;
    const FVec gate = randn(n, 10, 4.0), up = randn(n, 11), dact = randn(n, 12);
    const FVec dgb0 = randn(C, 13), dub0 = randn(C, 14);
    FVec dgate_ref(size_t(n), kNaN), dup_ref(size_t(n), kNaN), dgb_ref = dgb0, dub_ref = dub0;
    swiglu_backward(host(dact), host(gate), host(up), host(dgate_ref), host(dup_ref), n);
    bias_backward(host(dgate_ref), host(dgb_ref), N, C);
    bias_backward(host(dup_ref), host(dub_ref), N, C);
    DVec dgate_want(static_cast<size_t>(n)), dup_want(static_cast<size_t>(n));
    DVec dgb_want(dgb0.begin(), dgb0.end()), dub_want(dub0.begin(), dub0.end());
    for (int64_t r = 0; r < N; ++r)
      for (int64_t c = 0; c < C; ++c) {
        const size_t i = size_t(r * C + c);
        const double g = gate[i], s = sigmoid(g);
        dup_want[i] = dact[i] * g * s;
        dgate_want[i] = dact[i] * double(up[i]) * s * (1 + g * (1 - s));
        dgb_want[size_t(c)] += dgate_want[i];
        dub_want[size_t(c)] += dup_want[i];
      }
    for (bool bias : {true, false})
      for (DType t : {DType::f32, DType::bf16, DType::f16}) {
        const bool f32 = t == DType::f32;
        FVec dgate(size_t(n), kNaN), dup(size_t(n), kNaN), dgb = dgb0, dub = dub0;
        HVec dgate16(f32 ? 0 : size_t(n), 0xffff), dup16(f32 ? 0 : size_t(n), 0xffff);
        swiglu_bias_backward(host(dact), host(gate), host(up), f32 ? host(dgate) : Tensor{},
                             f32 ? host(dup) : Tensor{}, f32 ? Tensor{} : half_view(dgate16, t),
                             f32 ? Tensor{} : half_view(dup16, t), bias ? host(dgb) : Tensor{},
                             bias ? host(dub) : Tensor{}, N, C);
        if (f32) {
          expect_bits(dgate, dgate_ref, "swiglu dgate", N, C);
          expect_bits(dup, dup_ref, "swiglu dup", N, C);
          expect_near(dgate, dgate_want, 1e-5, 1e-6, "swiglu dgate vs double", N, C);
          expect_near(dup, dup_want, 1e-5, 1e-6, "swiglu dup vs double", N, C);
        } else {
          expect_rounded(dgate16, dgate_ref, t, "swiglu dgate16", N, C);
          expect_rounded(dup16, dup_ref, t, "swiglu dup16", N, C);
        }
        expect_bits(dgb, bias ? dgb_ref : dgb0, "swiglu dgate_bias", N, C);
        expect_bits(dub, bias ? dub_ref : dub0, "swiglu dup_bias", N, C);
        if (bias) {
          expect_near(dgb, dgb_want, 1e-5, 1e-5, "swiglu dgate_bias vs double", N, C);
          expect_near(dub, dub_want, 1e-5, 1e-5, "swiglu dup_bias vs double", N, C);
        }
      }
  }
}

// A 16-bit run keeps a norm's output only as its GEMMs' operand (model/block.cpp): the norms
// write it in bf16 / f16, the cast of the fp32 output, bit for bit; the statistics are the same.
TEST(KokkosEpilogue, NormsWrite16BitOutputsAsTheCastOfFp32) {
  for (const Case& k : kCases) {
    const int64_t N = k.N, C = k.C, n = N * C;
    const FVec x = randn(n, 31, 1.5, 2.0), w = randn(C, 32, 0.5, 1.0), b = randn(C, 33);
    FVec y(size_t(n), kNaN), mean(size_t(N), kNaN), rstd(size_t(N), kNaN);
    rmsnorm_forward(host(x), host(w), host(y), host(rstd), N, C, 1e-5f);
    FVec ly(size_t(n), kNaN), lmean(size_t(N), kNaN), lrstd(size_t(N), kNaN);
    layernorm_forward(host(x), host(w), host(b), host(ly), host(lmean), host(lrstd), N, C, 1e-5f);
    for (DType t : kHalves) {
      HVec y16(size_t(n), 0xffff), ly16(size_t(n), 0xffff);
      FVec rstd16(size_t(N), kNaN), lmean16(size_t(N), kNaN), lrstd16(size_t(N), kNaN);
      rmsnorm_forward(host(x), host(w), half_view(y16, t), host(rstd16), N, C, 1e-5f);
      expect_rounded(y16, y, t, "rmsnorm y16", N, C);
      expect_bits(rstd16, rstd, "rmsnorm rstd (16-bit y)", N, 1);
      layernorm_forward(host(x), host(w), host(b), half_view(ly16, t), host(lmean16),
                        host(lrstd16), N, C, 1e-5f);
      expect_rounded(ly16, ly, t, "layernorm y16", N, C);
      expect_bits(lmean16, lmean, "layernorm mean (16-bit y)", N, 1);
      expect_bits(lrstd16, lrstd, "layernorm rstd (16-bit y)", N, 1);
    }
  }
  // An output of another dtype is an error.
  std::vector<int32_t> yi(12);
  FVec x(12), w(4), r(3);
  EXPECT_THROW(rmsnorm_forward(host(x), host(w), view_of(yi.data(), Shape{12}),
                               host(r), 3, 4, 1e-5f),
               Error);
}

TEST(KokkosEpilogue, BadArgumentsAreErrors) {
  FVec a(12), b(12), d(12), bias(4);
  HVec h(12), h16(12);
  // No output at all, and a 16-bit output of another dtype than bf16 / f16.
  EXPECT_THROW(gelu_bias_backward(host(a), host(b), {}, {}, {}, 3, 4), Error);
  EXPECT_THROW(gelu_bias_forward(host(a), {}, host(b), host(d), 3, 4), Error);
  EXPECT_THROW(gelu_bias_forward(host(a), {}, {}, {}, 3, 4), Error);
  EXPECT_THROW(swiglu_bias_forward(host(a), host(b), {}, {}, {}, {}, 3, 4), Error);
  // SwiGLU's pairs: both or neither, one 16-bit dtype.
  EXPECT_THROW(swiglu_bias_forward(host(a), host(b), host(bias), {}, host(d), {}, 3, 4), Error);
  EXPECT_THROW(swiglu_bias_backward(host(a), host(b), host(d), {}, {}, half_view(h, DType::bf16),
                                    half_view(h16, DType::f16), {}, {}, 3, 4),
               Error);
  EXPECT_THROW(swiglu_bias_backward(host(a), host(b), host(d), host(a), {}, {}, {}, {}, {}, 3, 4),
               Error);
}

}  // namespace
}  // namespace tessera::kernels
