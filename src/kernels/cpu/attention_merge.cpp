// The online-softmax merge of context parallelism's partial attention results (kernels.hpp,
// kernels::attention_merge), in fp32.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace tessera::kernels::cpu {

void attention_merge(float* out, float* lse, const float* out_part, const float* lse_part,
                     int64_t B, int64_t T, int64_t H, int64_t D) {
  constexpr float kNoKey = -std::numeric_limits<float>::infinity();
#pragma omp parallel for collapse(3) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t st = (b * H + h) * T + t, at = ((b * T + t) * H + h) * D;
        const float la = lse[st], lb = lse_part[st];
        if (lb == kNoKey) continue;  // the block adds nothing to this row
        float* o = out + at;
        const float* p = out_part + at;
        if (la == kNoKey) {
          std::copy(p, p + D, o);
          lse[st] = lb;
          continue;
        }
        const float m = std::max(la, lb);
        const float wa = std::exp(la - m), wb = std::exp(lb - m), sum = wa + wb;
        const float ca = wa / sum, cb = wb / sum;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) o[d] = ca * o[d] + cb * p[d];
        lse[st] = m + std::log(sum);
      }
}

}  // namespace tessera::kernels::cpu
