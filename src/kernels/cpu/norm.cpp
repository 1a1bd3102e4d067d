// RMSNorm (llama) and LayerNorm (gpt2), forward and backward. Row statistics are computed in
// double; the weight/bias gradients are summed per thread over its rows, then combined.
#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/backend.hpp"

namespace tessera::kernels::cpu {
namespace {

// Runs body(row, dw_acc, db_acc) over rows with per-thread accumulators of C doubles,
// then adds the accumulators into dw (and db when given).
template <class Body>
void rows_with_param_grads(int64_t N, int64_t C, float* dw, float* db, Body body) {
  const int nt = omp_get_max_threads();
  std::vector<double> acc(size_t(nt) * size_t(C) * (db ? 2 : 1), 0.0);
#pragma omp parallel
  {
    const int t = omp_get_thread_num();
    double* dw_acc = acc.data() + size_t(t) * C * (db ? 2 : 1);
    double* db_acc = db ? dw_acc + C : nullptr;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < N; ++r) body(r, dw_acc, db_acc);
  }
  for (int t = 0; t < nt; ++t) {
    const double* dw_acc = acc.data() + size_t(t) * C * (db ? 2 : 1);
    for (int64_t c = 0; c < C; ++c) dw[c] += float(dw_acc[c]);
    if (db)
      for (int64_t c = 0; c < C; ++c) db[c] += float(dw_acc[C + c]);
  }
}

}  // namespace

void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, int64_t N, int64_t C,
                     float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += double(xr[c]) * xr[c];
    const float s = float(1.0 / std::sqrt(ss / double(C) + eps));
    rstd[r] = s;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * s * w[c];
  }
}

void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd,
                      float* dx, float* dw, int64_t N, int64_t C) {
  rows_with_param_grads(N, C, dw, nullptr, [&](int64_t r, double* dw_acc, double*) {
    const float* xr = x + r * C;
    const float* dyr = dy + r * C;
    float* dxr = dx + r * C;
    const float s = rstd[r];
    double dot = 0;  // sum_c w_c dy_c x_c
    for (int64_t c = 0; c < C; ++c) {
      dot += double(w[c]) * dyr[c] * xr[c];
      dw_acc[c] += double(dyr[c]) * xr[c] * s;
    }
    const float k = float(dot * s * s * s / double(C));
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) dxr[c] = s * w[c] * dyr[c] - k * xr[c];
  });
}

void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean,
                       float* rstd, int64_t N, int64_t C, float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    double m = 0;
    for (int64_t c = 0; c < C; ++c) m += xr[c];
    m /= double(C);
    double var = 0;
    for (int64_t c = 0; c < C; ++c) var += (xr[c] - m) * (xr[c] - m);
    var /= double(C);
    const float s = float(1.0 / std::sqrt(var + eps));
    const float mf = float(m);
    mean[r] = mf;
    rstd[r] = s;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - mf) * s * w[c] + b[c];
  }
}

void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean,
                        const float* rstd, float* dx, float* dw, float* db, int64_t N,
                        int64_t C) {
  rows_with_param_grads(N, C, dw, db, [&](int64_t r, double* dw_acc, double* db_acc) {
    const float* xr = x + r * C;
    const float* dyr = dy + r * C;
    float* dxr = dx + r * C;
    const float m = mean[r], s = rstd[r];
    double sum_g = 0, sum_gx = 0;  // g = dy * w; sums of g and g * xhat
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (xr[c] - m) * s;
      const double g = double(dyr[c]) * w[c];
      sum_g += g;
      sum_gx += g * xhat;
      dw_acc[c] += dyr[c] * xhat;
      db_acc[c] += dyr[c];
    }
    const float mg = float(sum_g / double(C)), mgx = float(sum_gx / double(C));
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      const float xhat = (xr[c] - m) * s;
      dxr[c] = s * (dyr[c] * w[c] - mg - xhat * mgx);
    }
  });
}

void register_norm(Backend& b) {
  b.rmsnorm_forward = rmsnorm_forward;
  b.rmsnorm_backward = rmsnorm_backward;
  b.layernorm_forward = layernorm_forward;
  b.layernorm_backward = layernorm_backward;
}

}  // namespace tessera::kernels::cpu
