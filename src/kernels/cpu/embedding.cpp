// Token/position embedding lookup and its scatter-add backward.
#include "kernels/backend.hpp"

namespace tessera::kernels::cpu {

void embedding_forward(const int32_t* ids, const float* table, float* out, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* src = table + int64_t(ids[n]) * C;
    float* dst = out + n * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) dst[c] = src[c];
  }
}

void embedding_backward(const int32_t* ids, const float* dout, float* dtable, int64_t N,
                        int64_t C) {
  // Rows may repeat, so threads split the columns, not the rows: race-free and deterministic.
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t c0 = 0; c0 < C; c0 += 16) {
      const int64_t c1 = c0 + 16 < C ? c0 + 16 : C;
      for (int64_t n = 0; n < N; ++n) {
        float* dst = dtable + int64_t(ids[n]) * C;
        const float* src = dout + n * C;
        for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
      }
    }
  }
}

void embedding_forward_range(const int32_t* ids, const float* table, float* out, int64_t N,
                             int64_t C, int64_t v0, int64_t rows) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const int64_t r = int64_t(ids[n]) - v0;
    float* dst = out + n * C;
    if (r < 0 || r >= rows) {
      for (int64_t c = 0; c < C; ++c) dst[c] = 0.0f;
      continue;
    }
    const float* src = table + r * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) dst[c] = src[c];
  }
}

void embedding_backward_range(const int32_t* ids, const float* dout, float* dtable, int64_t N,
                              int64_t C, int64_t v0, int64_t rows) {
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t c0 = 0; c0 < C; c0 += 16) {
      const int64_t c1 = c0 + 16 < C ? c0 + 16 : C;
      for (int64_t n = 0; n < N; ++n) {
        const int64_t r = int64_t(ids[n]) - v0;
        if (r < 0 || r >= rows) continue;
        float* dst = dtable + r * C;
        const float* src = dout + n * C;
        for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
      }
    }
  }
}

void register_embedding(Backend& b) {
  b.embedding_forward = embedding_forward;
  b.embedding_backward = embedding_backward;
  b.embedding_forward_range = embedding_forward_range;
  b.embedding_backward_range = embedding_backward_range;
}

}  // namespace tessera::kernels::cpu
