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
#include "kernels/kernels.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace tessera::kernels {
namespace {

using DVec = std::vector<double>;
using test::host;

struct Shape {
  int64_t B, T, Hq, Hkv, D;
  double scale;  // 0 means 1/sqrt(D)
  double input_std = 1.0;

  AttnShape attn() const {
    return {B, T, Hq, Hkv, D, float(scale != 0.0 ? scale : 1.0 / std::sqrt(double(D)))};
  }
  int64_t q_size() const { return B * T * Hq * D; }
  int64_t kv_size() const { return B * T * Hkv * D; }
  int64_t lse_size() const { return B * Hq * T; }
};

std::ostream& operator<<(std::ostream& os, const Shape& s) {
  return os << "B" << s.B << "_T" << s.T << "_Hq" << s.Hq << "_Hkv" << s.Hkv << "_D" << s.D
            << "_scale" << s.scale << "_std" << s.input_std;
}

// Naive reference: for each (b, h, i) the full softmax over keys j <= i.
struct Naive {
  explicit Naive(const Shape& shape) : s(shape.attn()) {}
  AttnShape s;

  int64_t qi(int64_t b, int64_t t, int64_t h) const { return ((b * s.T + t) * s.Hq + h) * s.D; }
  int64_t ki(int64_t b, int64_t t, int64_t g) const { return ((b * s.T + t) * s.Hkv + g) * s.D; }
  int64_t kv_head(int64_t h) const { return h / (s.Hq / s.Hkv); }
  double score(const DVec& q, const DVec& k, int64_t b, int64_t i, int64_t j, int64_t h) const {
    double acc = 0;
    for (int64_t d = 0; d < s.D; ++d) acc += q[qi(b, i, h) + d] * k[ki(b, j, kv_head(h)) + d];
    return double(s.scale) * acc;
  }
  // Probabilities P[j] (j <= i) of query row (b, i, h), and its lse.
  double probs(const DVec& q, const DVec& k, int64_t b, int64_t i, int64_t h, DVec& p) const {
    p.assign(i + 1, 0.0);
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j <= i; ++j) mx = std::max(mx, p[j] = score(q, k, b, i, j, h));
    double sum = 0;
    for (int64_t j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - mx));
    for (int64_t j = 0; j <= i; ++j) p[j] /= sum;
    return mx + std::log(sum);
  }

  void forward(const DVec& q, const DVec& k, const DVec& v, DVec& out, DVec& lse) const {
    out.assign(q.size(), 0.0);
    lse.assign(s.B * s.Hq * s.T, 0.0);
    DVec p;
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t h = 0; h < s.Hq; ++h)
        for (int64_t i = 0; i < s.T; ++i) {
          lse[(b * s.Hq + h) * s.T + i] = probs(q, k, b, i, h, p);
          for (int64_t j = 0; j <= i; ++j)
            for (int64_t d = 0; d < s.D; ++d)
              out[qi(b, i, h) + d] += p[j] * v[ki(b, j, kv_head(h)) + d];
        }
  }

  // With P = softmax(S): dV_j += P_ij dO_i, dP_ij = dO_i . v_j,
  // dS_ij = P_ij (dP_ij - sum_j' P_ij' dP_ij'), dQ_i += scale dS_ij k_j, dK_j += scale dS_ij q_i.
  void backward(const DVec& dout, const DVec& q, const DVec& k, const DVec& v, DVec& dq, DVec& dk,
                DVec& dv) const {
    dq.assign(q.size(), 0.0);
    dk.assign(k.size(), 0.0);
    dv.assign(v.size(), 0.0);
    DVec p, dp;
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t h = 0; h < s.Hq; ++h)
        for (int64_t i = 0; i < s.T; ++i) {
          const int64_t g = kv_head(h);
          probs(q, k, b, i, h, p);
          dp.assign(i + 1, 0.0);
          double rowdot = 0;
          for (int64_t j = 0; j <= i; ++j) {
            for (int64_t d = 0; d < s.D; ++d) dp[j] += dout[qi(b, i, h) + d] * v[ki(b, j, g) + d];
            rowdot += p[j] * dp[j];
          }
          for (int64_t j = 0; j <= i; ++j) {
            const double ds = p[j] * (dp[j] - rowdot) * s.scale;
            for (int64_t d = 0; d < s.D; ++d) {
              dv[ki(b, j, g) + d] += p[j] * dout[qi(b, i, h) + d];
              dq[qi(b, i, h) + d] += ds * k[ki(b, j, g) + d];
              dk[ki(b, j, g) + d] += ds * q[qi(b, i, h) + d];
            }
          }
        }
  }
};

DVec random_vec(int64_t n, std::mt19937& rng, double stddev) {
  std::normal_distribution<double> dist(0.0, stddev);
  DVec x(n);
  // Round through float so that the float kernel and the double reference see equal inputs.
  for (auto& e : x) e = double(float(dist(rng)));
  return x;
}

std::vector<float> to_float(const DVec& x) {
  return std::vector<float>(x.begin(), x.end());
}

// max |a - b| / max(1, max |ref|)
template <typename T>
double rel_err(const std::vector<T>& a, const DVec& ref) {
  double diff = 0, mag = 1;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - ref[i]));
    mag = std::max(mag, std::abs(ref[i]));
  }
  return diff / mag;
}

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

}  // namespace
}  // namespace tessera::kernels
