// The naive attention the attention kernel tests compare with: for each (b, h, i) the full
// softmax over the keys query i sees, in double precision; with document starts (doc[b * T +
// i], kernels.hpp) only the keys of [doc, i]. Shared by test_attention.cpp and
// test_document_mask.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <utility>
#include <vector>

#include "kernels/kernels.hpp"

namespace tessera::kernels::naive {

using DVec = std::vector<double>;

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

inline std::ostream& operator<<(std::ostream& os, const Shape& s) {
  return os << "B" << s.B << "_T" << s.T << "_Hq" << s.Hq << "_Hkv" << s.Hkv << "_D" << s.D
            << "_scale" << s.scale << "_std" << s.input_std;
}

// Naive reference: for each (b, h, i) the full softmax over keys j <= i.
struct Naive {
  explicit Naive(const Shape& shape, std::vector<int32_t> doc_start = {})
      : s(shape.attn()), doc(std::move(doc_start)) {}
  AttnShape s;
  std::vector<int32_t> doc;  // [B, T] document starts, or empty: plain causal

  int64_t first(int64_t b, int64_t i) const { return doc.empty() ? 0 : doc[b * s.T + i]; }
  int64_t qi(int64_t b, int64_t t, int64_t h) const { return ((b * s.T + t) * s.Hq + h) * s.D; }
  int64_t ki(int64_t b, int64_t t, int64_t g) const { return ((b * s.T + t) * s.Hkv + g) * s.D; }
  int64_t kv_head(int64_t h) const { return h / (s.Hq / s.Hkv); }
  double score(const DVec& q, const DVec& k, int64_t b, int64_t i, int64_t j, int64_t h) const {
    double acc = 0;
    for (int64_t d = 0; d < s.D; ++d) acc += q[qi(b, i, h) + d] * k[ki(b, j, kv_head(h)) + d];
    return double(s.scale) * acc;
  }
  // Probabilities P[j] (j <= i; 0 before the row's document) of query row (b, i, h), and its
  // lse.
  double probs(const DVec& q, const DVec& k, int64_t b, int64_t i, int64_t h, DVec& p) const {
    p.assign(i + 1, 0.0);
    const int64_t j0 = first(b, i);
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = j0; j <= i; ++j) mx = std::max(mx, p[j] = score(q, k, b, i, j, h));
    double sum = 0;
    for (int64_t j = j0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - mx));
    for (int64_t j = j0; j <= i; ++j) p[j] /= sum;
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

inline DVec random_vec(int64_t n, std::mt19937& rng, double stddev) {
  std::normal_distribution<double> dist(0.0, stddev);
  DVec x(n);
  // Round through float so that the float kernel and the double reference see equal inputs.
  for (auto& e : x) e = double(float(dist(rng)));
  return x;
}

inline std::vector<float> to_float(const DVec& x) {
  return std::vector<float>(x.begin(), x.end());
}

// max |a - b| / max(1, max |ref|); infinite when a holds a NaN or an infinity
template <typename T>
double rel_err(const std::vector<T>& a, const DVec& ref) {
  double diff = 0, mag = 1;
  for (size_t i = 0; i < ref.size(); ++i) {
    // A NaN (say the garbage of an element never written) is an infinite error: std::max
    // would pass over it.
    if (!std::isfinite(double(a[i]))) return std::numeric_limits<double>::infinity();
    diff = std::max(diff, std::abs(double(a[i]) - ref[i]));
    mag = std::max(mag, std::abs(ref[i]));
  }
  return diff / mag;
}

}  // namespace tessera::kernels::naive
