// Softmax cross-entropy fused with its backward (the logits become the gradient, or the
// gradient goes rounded to a 16-bit buffer), whole or vocabulary-parallel; one team per row,
// sums of exponentials in double. A negative target (a masked one, doc/data.md "Loss masks")
// gives its row the loss 0 and a zero gradient, as PyTorch's ignore_index.
#include <cfloat>

#include "kernels/kokkos/kokkos.hpp"

namespace tessera::kernels::kokkos {

// Calls body(out) with the writer of row n's gradient (row stride V), kokkos.hpp's Store*:
// into dlogits, of the 16-bit kind, when given, else over the logits themselves.
template <class Body>
KOKKOS_INLINE_FUNCTION void with_grad_row(float* logits, uint16_t* dlogits, bool f16, int64_t n,
                                          int64_t V, const Body& body) {
  if (!dlogits) return body(StoreF32{logits + n * V});
  if (f16) return body(StoreF16{dlogits + n * V});
  body(StoreBf16{dlogits + n * V});
}

template <class E>
struct CrossEntropy {
  // max over row[0 .. n) (n >= 1), a block of sum_block elements at a time; on the host each
  // block is one vectorised max (GCC vectorises a max only as an OpenMP simd reduction). A NaN
  // may or may not be taken: either way the row's sum of exponentials, and its loss, is NaN.
  KOKKOS_INLINE_FUNCTION static float row_max(const Team<E>& team, const float* row, int64_t n) {
    float m = row[0];
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, blocks<E>(n)),
        [&](int64_t blk, float& acc) {
          const int64_t i0 = blk * sum_block<E>;
          const int64_t i1 = n - i0 < sum_block<E> ? n : i0 + sum_block<E>;
          float b = acc;
#ifndef __CUDA_ARCH__
#pragma omp simd reduction(max : b)
#endif
          for (int64_t i = i0; i < i1; ++i) b = row[i] > b ? row[i] : b;
          acc = b > acc ? b : acc;
        },
        Kokkos::Max<float>(m));
    return m;
  }
  // row[v] = exp(row[v] - shift) for v < n; returns their sum in double.
  KOKKOS_INLINE_FUNCTION static double exp_shifted_sum(const Team<E>& team, float* row,
                                                       float shift, int64_t n) {
    return team_sum<E>(team, n, [&](int64_t v) {
      const float e = exp_poly(row[v] - shift);
      row[v] = e;
      return double(e);
    });
  }
  // The sum in double of exp(row[v] - shift) for v < n, row unchanged.
  KOKKOS_INLINE_FUNCTION static double exp_sum(const Team<E>& team, const float* row, float shift,
                                               int64_t n) {
    return team_sum<E>(team, n, [&](int64_t v) { return double(exp_poly(row[v] - shift)); });
  }
  // out(v, g) with g = grad_scale * e(v) / sum on the valid columns, 0 on the padding, minus
  // grad_scale at the target column t (if it is in [0, V_valid)); e(v): the column's exponential.
  template <class Out, class Exp>
  KOKKOS_INLINE_FUNCTION static void finish_row(const Team<E>& team, const Exp& e, const Out& out,
                                                int64_t V, int64_t V_valid, int64_t t, double sum,
                                                float grad_scale) {
    const float inv = float(grad_scale / sum);
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, V), [&](int64_t v) {
      const float g = v < V_valid ? e(v) * inv : 0.0f;
      out(v, v == t && v < V_valid ? g - grad_scale : g);
    });
  }

  // A masked row (negative target): loss 0 (where a loss is written) and a zero gradient on
  // every column. The branch is the same for every thread of the team (one row per team).
  template <class Out>
  KOKKOS_INLINE_FUNCTION static void masked_row(const Team<E>& team, const Out& out, float* loss,
                                                int64_t V) {
    if (loss) Kokkos::single(Kokkos::PerTeam(team), [&] { *loss = 0.0f; });
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, V), [&](int64_t v) { out(v, 0.0f); });
  }

  static void fused(float* logits, const int32_t* targets, float* losses, int64_t N, int64_t V,
                    int64_t V_valid, float grad_scale, uint16_t* dlogits, bool f16) {
    Kokkos::parallel_for(
        "cross_entropy_fused", rows<E>(N), TESSERA_LAMBDA(E, (const Team<E>& team) {
          const int64_t n = team.league_rank();
          float* row = logits + n * V;
          const int32_t t = targets[n];
          if (t < 0)
            return with_grad_row(logits, dlogits, f16, n, V,
                                 [&](const auto& out) { masked_row(team, out, losses + n, V); });
          const float mx = row_max(team, row, V_valid);
          const float target_logit = row[t] - mx;
          team.team_barrier();
          // The exponentials are computed twice (sum, then gradient) rather than stored: the
          // row stays clean in cache, and no write-back of the whole logits goes to memory.
          const double sum = exp_sum(team, row, mx, V_valid);
          Kokkos::single(Kokkos::PerTeam(team),
                         [&] { losses[n] = float(Kokkos::log(sum) - double(target_logit)); });
          const auto e = [&](int64_t v) { return exp_poly(row[v] - mx); };
          with_grad_row(logits, dlogits, f16, n, V, [&](const auto& out) {
            finish_row(team, e, out, V, V_valid, t, sum, grad_scale);
          });
        }));
  }

  static void local_max(const float* logits, float* row_max_out, int64_t N, int64_t V,
                        int64_t V_valid) {
    Kokkos::parallel_for(
        "cross_entropy_local_max", rows<E>(N), TESSERA_LAMBDA(E, (const Team<E>& team) {
          const int64_t n = team.league_rank();
          const float m = V_valid > 0 ? row_max(team, logits + n * V, V_valid)
                                      : -Kokkos::Experimental::infinity_v<float>;
          Kokkos::single(Kokkos::PerTeam(team), [&] { row_max_out[n] = m; });
        }));
  }

  static void local_exp(float* logits, const int32_t* targets, const float* row_max_in,
                        double* sum_exp, float* target_logit, int64_t N, int64_t V,
                        int64_t V_valid, int64_t v0) {
    Kokkos::parallel_for(
        "cross_entropy_local_exp", rows<E>(N), TESSERA_LAMBDA(E, (const Team<E>& team) {
          const int64_t n = team.league_rank();
          float* row = logits + n * V;
          const int64_t t = int64_t(targets[n]) - v0;
          const float tl = t >= 0 && t < V_valid ? row[t] - row_max_in[n] : 0.0f;
          team.team_barrier();
          const double s = V_valid > 0 ? exp_shifted_sum(team, row, row_max_in[n], V_valid) : 0.0;
          Kokkos::single(Kokkos::PerTeam(team), [&] {
            target_logit[n] = tl;
            sum_exp[n] = s;
          });
        }));
  }

  static void local_finish(float* logits, const int32_t* targets, const double* sum_exp,
                           const float* target_logit, float* losses, int64_t N, int64_t V,
                           int64_t V_valid, int64_t v0, float grad_scale, uint16_t* dlogits,
                           bool f16) {
    Kokkos::parallel_for(
        "cross_entropy_local_finish", rows<E>(N), TESSERA_LAMBDA(E, (const Team<E>& team) {
          const int64_t n = team.league_rank();
          if (targets[n] < 0)
            return with_grad_row(logits, dlogits, f16, n, V,
                                 [&](const auto& out) { masked_row(team, out, losses + n, V); });
          Kokkos::single(Kokkos::PerTeam(team), [&] {
            losses[n] = float(Kokkos::log(sum_exp[n]) - double(target_logit[n]));
          });
          const int64_t t = int64_t(targets[n]) - v0;
          with_grad_row(logits, dlogits, f16, n, V, [&](const auto& out) {
            const float* row = logits + n * V;  // holds the exponentials (local_exp)
            finish_row(team, [&](int64_t v) { return row[v]; }, out, V, V_valid, t, sum_exp[n],
                       grad_scale);
          });
        }));
  }

  // Over vocabulary tiles (kernels.hpp's cross_entropy_tile_*): the statistics run along the
  // tiles as an online softmax's do. The sum of a tile is taken against the maximum so far, in
  // double, and the earlier sum moved to it by exp(old - new) in double.
  static void tile_stats(const float* logits, const int32_t* targets, float* run_max,
                         double* sum_exp, float* target_logit, int64_t N, int64_t T, int64_t c0,
                         bool first) {
    Kokkos::parallel_for(
        "cross_entropy_tile_stats", rows<E>(N), TESSERA_LAMBDA(E, (const Team<E>& team) {
          const int64_t n = team.league_rank();
          const float* row = logits + n * T;
          const float neg_inf = -Kokkos::Experimental::infinity_v<float>;
          const float old_max = first ? neg_inf : run_max[n];
          const double old_sum = first ? 0.0 : sum_exp[n];
          const float tile_max = T > 0 ? row_max(team, row, T) : neg_inf;
          const float mx = tile_max > old_max ? tile_max : old_max;
          const double s = T > 0 ? exp_sum(team, row, mx, T) : 0.0;
          const int64_t t = int64_t(targets[n]) - c0;
          team.team_barrier();
          Kokkos::single(Kokkos::PerTeam(team), [&] {
            // old_sum is 0 (nothing seen yet) or holds at least exp(0): its maximum is finite.
            run_max[n] = mx;
            sum_exp[n] = s + (old_sum > 0 ? old_sum * Kokkos::exp(double(old_max) - double(mx)) : 0.0);
            if (t >= 0 && t < T) target_logit[n] = row[t];
            else if (first) target_logit[n] = 0.0f;
          });
        }));
  }

  static void rescale(double* sum_exp, const float* local_max, const float* row_max_in,
                      int64_t N) {
    Kokkos::parallel_for(
        "cross_entropy_rescale", range<E>(N), TESSERA_LAMBDA(E, (int64_t n) {
          if (sum_exp[n] > 0) sum_exp[n] *= Kokkos::exp(double(local_max[n]) - double(row_max_in[n]));
        }));
  }

  static void tile_loss(const int32_t* targets, const float* row_max_in, const double* sum_exp,
                        const float* target_logit, float* losses, int64_t N) {
    Kokkos::parallel_for(
        "cross_entropy_tile_loss", range<E>(N), TESSERA_LAMBDA(E, (int64_t n) {
          losses[n] = targets[n] < 0 ? 0.0f
                                     : float(Kokkos::log(sum_exp[n]) + double(row_max_in[n]) -
                                             double(target_logit[n]));
        }));
  }

  static void tile_grad(float* logits, const int32_t* targets, const float* row_max_in,
                        const double* sum_exp, int64_t N, int64_t T, int64_t c0, float grad_scale,
                        uint16_t* dlogits, bool f16) {
    Kokkos::parallel_for(
        "cross_entropy_tile_grad", rows<E>(N), TESSERA_LAMBDA(E, (const Team<E>& team) {
          const int64_t n = team.league_rank();
          const int64_t t = int64_t(targets[n]) - c0;
          with_grad_row(logits, dlogits, f16, n, T, [&](const auto& out) {
            if (targets[n] < 0) return masked_row(team, out, nullptr, T);
            const float* row = logits + n * T;
            const float mx = row_max_in[n];
            const auto e = [&](int64_t v) { return exp_poly(row[v] - mx); };
            finish_row(team, e, out, T, T, t, sum_exp[n], grad_scale);
          });
        }));
  }

  static void fill(Backend& b) {
    b.cross_entropy_fused = fused;
    b.cross_entropy_local_max = local_max;
    b.cross_entropy_local_exp = local_exp;
    b.cross_entropy_local_finish = local_finish;
    b.cross_entropy_tile_stats = tile_stats;
    b.cross_entropy_rescale = rescale;
    b.cross_entropy_tile_loss = tile_loss;
    b.cross_entropy_tile_grad = tile_grad;
  }
};

void register_cross_entropy(Backend& b, Target t) {
  register_for<CrossEntropy>(b, t);
}

}  // namespace tessera::kernels::kokkos
