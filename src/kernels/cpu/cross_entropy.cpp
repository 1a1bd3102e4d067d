// Softmax cross-entropy fused with its backward: the logits buffer is overwritten with the
// gradient, so the full-vocabulary probabilities never need a second buffer. The row maximum
// and exponentials are vectorised with vec_math.hpp.
#include <cmath>

#include "kernels/cpu/vec_math.hpp"
#include "kernels/kernels.hpp"

namespace tessera::kernels {

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

}  // namespace tessera::kernels
