// Elementwise kernels and small reductions.
#include <omp.h>

#include <cstddef>
#include <vector>

#include "kernels/backend.hpp"

namespace tessera::kernels::cpu {

void fill(float* x, float value, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] = value;
}

void copy(const float* x, float* y, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i];
}

void add_inplace(float* y, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void scale_inplace(float* x, float alpha, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
}

double sum_squares(const float* x, int64_t n) {
  double s = 0;
#pragma omp parallel for simd reduction(+ : s) schedule(static)
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * x[i];
  return s;
}

void sum_squares_accumulate(const float* x, int64_t n, double* total) {
  *total += sum_squares(x, n);
}

void bias_add(float* y, const float* b, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    float* row = y + r * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) row[c] += b[c];
  }
}

void bias_backward(const float* dy, float* db, int64_t N, int64_t C) {
  // Columns split over threads: each thread sums its own columns over all rows.
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t c0 = C * t / nt, c1 = C * (t + 1) / nt;
    std::vector<double> acc(std::size_t(c1 - c0), 0.0);
    for (int64_t r = 0; r < N; ++r) {
      const float* row = dy + r * C;
      for (int64_t c = c0; c < c1; ++c) acc[std::size_t(c - c0)] += row[c];
    }
    for (int64_t c = c0; c < c1; ++c) db[c] += float(acc[std::size_t(c - c0)]);
  }
}

void register_elementwise(Backend& b) {
  b.fill = fill;
  b.copy = copy;
  b.add_inplace = add_inplace;
  b.scale_inplace = scale_inplace;
  b.sum_squares = sum_squares;
  b.sum_squares_accumulate = sum_squares_accumulate;
  b.bias_backward = bias_backward;
  b.bias_add = bias_add;
}

}  // namespace tessera::kernels::cpu
