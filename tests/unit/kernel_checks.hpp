// Shared by the kernel unit tests: double-precision references and their comparisons.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "../test_vectors.hpp"

namespace tessera::kernels::check {

using DVec = std::vector<double>;
using test::FVec;
using test::host;
using test::randn;

constexpr double kRel = 1e-5;  // relative tolerance of fp32 results
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

inline DVec to_double(const FVec& v) {
  return DVec(v.begin(), v.end());
}

inline double max_abs(const DVec& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// Every element: |got - want| <= rtol * |want| + atol; atol < 0 means rtol * max|want|, i.e.
// an error relative to the tensor's scale for elements that cancel to near zero.
inline void expect_close(const float* got, const DVec& want, double rtol, double atol,
                         const std::string& what) {
  if (atol < 0) atol = rtol * max_abs(want);
  int reported = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::abs(double(got[i]) - want[i]);
    if (!(err <= rtol * std::abs(want[i]) + atol)) {
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", expected " << want[i]
                    << " (error " << err << ", rtol " << rtol << ", atol " << atol << ")";
      if (++reported == 5) return;
    }
  }
}
inline void expect_close(const FVec& got, const DVec& want, double rtol, double atol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  expect_close(got.data(), want, rtol, atol, what);
}

// d/dx of sum(dy * f(x)) by central differences in double precision.
inline DVec numeric_vjp(const std::function<DVec(const DVec&)>& f, DVec x, const DVec& dy,
                        double h = 1e-5) {
  DVec grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const DVec fp = f(x);
    x[i] = x0 - h;
    const DVec fm = f(x);
    x[i] = x0;
    double g = 0;
    for (size_t j = 0; j < dy.size(); ++j) g += dy[j] * (fp[j] - fm[j]);
    grad[i] = g / (2 * h);
  }
  return grad;
}

}  // namespace tessera::kernels::check
