// Softmax cross-entropy fused with its backward: the logits buffer is overwritten with the
// gradient, so the full-vocabulary probabilities never need a second buffer. The row maximum
// and exponentials are vectorised with vec_math.hpp.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/backend.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace tessera::kernels::cpu {

void cross_entropy_fused(float* logits, const int32_t* targets, float* losses, int64_t N,
                         int64_t V, int64_t V_valid, float grad_scale) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* row = logits + n * V;
    const float mx = vec::max_of(row, V_valid);
    const int32_t t = targets[n];
    const float target_logit = row[t] - mx;
    // row[v] = exp(row[v] - mx) <= 1, summed in double.
    const double sum = vec::exp_shifted_sum(row, mx, row, V_valid);
    losses[n] = float(std::log(sum) - double(target_logit));
    const float inv = float(grad_scale / sum);
#pragma omp simd
    for (int64_t v = 0; v < V_valid; ++v) row[v] *= inv;
    for (int64_t v = V_valid; v < V; ++v) row[v] = 0.0f;
    row[t] -= grad_scale;
  }
}

void cross_entropy_local_max(const float* logits, float* row_max, int64_t N, int64_t V,
                             int64_t V_valid) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    row_max[n] = V_valid > 0 ? vec::max_of(logits + n * V, V_valid)
                             : -std::numeric_limits<float>::infinity();
}

void cross_entropy_local_exp(float* logits, const int32_t* targets, const float* row_max,
                             double* sum_exp, float* target_logit, int64_t N, int64_t V,
                             int64_t V_valid, int64_t v0) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* row = logits + n * V;
    const int64_t t = int64_t(targets[n]) - v0;
    target_logit[n] = t >= 0 && t < V_valid ? row[t] - row_max[n] : 0.0f;
    sum_exp[n] = V_valid > 0 ? vec::exp_shifted_sum(row, row_max[n], row, V_valid) : 0.0;
  }
}

void cross_entropy_local_finish(float* logits, const int32_t* targets, const double* sum_exp,
                                const float* target_logit, float* losses, int64_t N, int64_t V,
                                int64_t V_valid, int64_t v0, float grad_scale) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    float* row = logits + n * V;
    losses[n] = float(std::log(sum_exp[n]) - double(target_logit[n]));
    const float inv = float(grad_scale / sum_exp[n]);
#pragma omp simd
    for (int64_t v = 0; v < V_valid; ++v) row[v] *= inv;
    for (int64_t v = std::max<int64_t>(V_valid, 0); v < V; ++v) row[v] = 0.0f;
    const int64_t t = int64_t(targets[n]) - v0;
    if (t >= 0 && t < V_valid) row[t] -= grad_scale;
  }
}

void register_cross_entropy(Backend& b) {
  b.cross_entropy_fused = cross_entropy_fused;
  b.cross_entropy_local_max = cross_entropy_local_max;
  b.cross_entropy_local_exp = cross_entropy_local_exp;
  b.cross_entropy_local_finish = cross_entropy_local_finish;
}

}  // namespace tessera::kernels::cpu
