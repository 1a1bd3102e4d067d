// RMSNorm (llama) and LayerNorm (gpt2), forward and backward. Row statistics in double, one
// team per row; the weight and bias gradients in a second pass, parallel over columns, each
// column summed over the rows in order (deterministic for any thread count). The forwards
// write their output in fp32 or, rounded from the same fp32 value, in bf16 / fp16.
#include "kernels/kokkos/kokkos.hpp"

namespace tessera::kernels::kokkos {
namespace {

// fn(store) for a norm's output: y in fp32, or y16 in bf16 (f16: in fp16).
template <class Fn>
void with_store(float* y, uint16_t* y16, bool f16, const Fn& fn) {
  if (y) return fn(StoreF32{y});
  if (f16) return fn(StoreF16{y16});
  fn(StoreBf16{y16});
}

}  // namespace

template <class E>
struct Norm {
  static void rmsnorm_forward(const float* x, const float* w, float* y, uint16_t* y16, bool f16,
                              float* rstd, int64_t N, int64_t C, float eps) {
    with_store(y, y16, f16, [&](auto store) { rmsnorm_rows(x, w, store, rstd, N, C, eps); });
  }
  template <class Store>
  static void rmsnorm_rows(const float* x, const float* w, Store store, float* rstd, int64_t N,
                           int64_t C, float eps) {
    Kokkos::parallel_for(
        "rmsnorm_forward", rows<E>(N), TESSERA_LAMBDA(E, (const Team<E>& team) {
          const int64_t r = team.league_rank();
          const float* xr = x + r * C;
          const double ss = team_sum<E>(team, C, [&](int64_t c) { return double(xr[c]) * xr[c]; });
          const float s = float(1.0 / Kokkos::sqrt(ss / double(C) + eps));
          Kokkos::single(Kokkos::PerTeam(team), [&] { rstd[r] = s; });
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C),
                               [&](int64_t c) { store(r * C + c, xr[c] * s * w[c]); });
        }));
  }

  static void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd,
                               float* dx, float* dw, int64_t N, int64_t C) {
    Kokkos::parallel_for(
        "rmsnorm_backward_dx", rows<E>(N), TESSERA_LAMBDA(E, (const Team<E>& team) {
          const int64_t r = team.league_rank();
          const float* xr = x + r * C;
          const float* dyr = dy + r * C;
          float* dxr = dx + r * C;
          const float s = rstd[r];
          const double dot =  // sum_c w_c dy_c x_c
              team_sum<E>(team, C, [&](int64_t c) { return double(w[c]) * dyr[c] * xr[c]; });
          const float k = float(dot * s * s * s / double(C));
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C),
                               [&](int64_t c) { dxr[c] = s * w[c] * dyr[c] - k * xr[c]; });
        }));
    constexpr int64_t W = column_block<E>;
    Kokkos::parallel_for(
        "rmsnorm_backward_dw", range<E>(column_blocks<E>(C)), TESSERA_LAMBDA(E, (int64_t blk) {
          const int64_t c0 = blk * W, n = C - c0 < W ? C - c0 : W;
          double acc[W] = {};
          for (int64_t r = 0; r < N; ++r) {
            const double s = rstd[r];
            for_lanes<W>(n, [&](int64_t k) {
              acc[k] += double(dy[r * C + c0 + k]) * x[r * C + c0 + k] * s;
            });
          }
          for (int64_t k = 0; k < n; ++k) dw[c0 + k] += float(acc[k]);
        }));
  }

  static void layernorm_forward(const float* x, const float* w, const float* b, float* y,
                                uint16_t* y16, bool f16, float* mean, float* rstd, int64_t N,
                                int64_t C, float eps) {
    with_store(y, y16, f16,
               [&](auto store) { layernorm_rows(x, w, b, store, mean, rstd, N, C, eps); });
  }
  template <class Store>
  static void layernorm_rows(const float* x, const float* w, const float* b, Store store,
                             float* mean, float* rstd, int64_t N, int64_t C, float eps) {
    Kokkos::parallel_for(
        "layernorm_forward", rows<E>(N), TESSERA_LAMBDA(E, (const Team<E>& team) {
          const int64_t r = team.league_rank();
          const float* xr = x + r * C;
          const double m = team_sum<E>(team, C, [&](int64_t c) { return double(xr[c]); }) / double(C);
          const double var =
              team_sum<E>(team, C, [&](int64_t c) { return (xr[c] - m) * (xr[c] - m); }) / double(C);
          const float s = float(1.0 / Kokkos::sqrt(var + eps));
          const float mf = float(m);
          Kokkos::single(Kokkos::PerTeam(team), [&] {
            mean[r] = mf;
            rstd[r] = s;
          });
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C),
                               [&](int64_t c) { store(r * C + c, (xr[c] - mf) * s * w[c] + b[c]); });
        }));
  }

  static void layernorm_backward(const float* dy, const float* x, const float* w,
                                 const float* mean, const float* rstd, float* dx, float* dw,
                                 float* db, int64_t N, int64_t C) {
    Kokkos::parallel_for(
        "layernorm_backward_dx", rows<E>(N), TESSERA_LAMBDA(E, (const Team<E>& team) {
          const int64_t r = team.league_rank();
          const float* xr = x + r * C;
          const float* dyr = dy + r * C;
          float* dxr = dx + r * C;
          const float m = mean[r], s = rstd[r];
          // g = dy * w; sums of g and g * xhat
          const double sum_g = team_sum<E>(team, C, [&](int64_t c) { return double(dyr[c]) * w[c]; });
          const double sum_gx = team_sum<E>(team, C, [&](int64_t c) {
            const double xhat = (xr[c] - m) * s;
            return double(dyr[c]) * w[c] * xhat;
          });
          const float mg = float(sum_g / double(C)), mgx = float(sum_gx / double(C));
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C), [&](int64_t c) {
            const float xhat = (xr[c] - m) * s;
            dxr[c] = s * (dyr[c] * w[c] - mg - xhat * mgx);
          });
        }));
    constexpr int64_t W = column_block<E>;
    Kokkos::parallel_for(
        "layernorm_backward_dw", range<E>(column_blocks<E>(C)), TESSERA_LAMBDA(E, (int64_t blk) {
          const int64_t c0 = blk * W, n = C - c0 < W ? C - c0 : W;
          double acc_w[W] = {}, acc_b[W] = {};
          for (int64_t r = 0; r < N; ++r) {
            const float m = mean[r], s = rstd[r];
            for_lanes<W>(n, [&](int64_t k) {
              const int64_t i = r * C + c0 + k;
              const double xhat = (x[i] - m) * s;
              acc_w[k] += dy[i] * xhat;
              acc_b[k] += dy[i];
            });
          }
          for (int64_t k = 0; k < n; ++k) {
            dw[c0 + k] += float(acc_w[k]);
            db[c0 + k] += float(acc_b[k]);
          }
        }));
  }

  static void fill(Backend& b) {
    b.rmsnorm_forward = rmsnorm_forward;
    b.rmsnorm_backward = rmsnorm_backward;
    b.layernorm_forward = layernorm_forward;
    b.layernorm_backward = layernorm_backward;
  }
};

void register_norm(Backend& b, Target t) {
  register_for<Norm>(b, t);
}

}  // namespace tessera::kernels::kokkos
