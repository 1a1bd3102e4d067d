// Softmax cross-entropy fused with its backward (the logits become the gradient), whole or
// vocabulary-parallel; one team per row, sums of exponentials in double.
#include <cfloat>

#include "kernels/kokkos/kokkos.hpp"

namespace tessera::kernels::kokkos {

template <class E>
struct CrossEntropy {
  // max over row[0 .. n) (n >= 1), ignoring NaNs after row[0] as `m = v > m ? v : m` does.
  KOKKOS_INLINE_FUNCTION static float row_max(const Team<E>& team, const float* row, int64_t n) {
    float m = row[0];
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, n),
        [&](int64_t v, float& acc) { acc = row[v] > acc ? row[v] : acc; },
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
  // row = grad_scale * row / sum on the valid columns, 0 on the padding, minus grad_scale at
  // the target column t (if it is in [0, V_valid)).
  KOKKOS_INLINE_FUNCTION static void finish_row(const Team<E>& team, float* row, int64_t V,
                                                int64_t V_valid, int64_t t, double sum,
                                                float grad_scale) {
    const float inv = float(grad_scale / sum);
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, V), [&](int64_t v) {
      const float g = v < V_valid ? row[v] * inv : 0.0f;
      row[v] = v == t && v < V_valid ? g - grad_scale : g;
    });
  }

  static void fused(float* logits, const int32_t* targets, float* losses, int64_t N, int64_t V,
                    int64_t V_valid, float grad_scale) {
    Kokkos::parallel_for(
        "cross_entropy_fused", rows<E>(N), KOKKOS_LAMBDA(const Team<E>& team) {
          const int64_t n = team.league_rank();
          float* row = logits + n * V;
          const float mx = row_max(team, row, V_valid);
          const int32_t t = targets[n];
          const float target_logit = row[t] - mx;
          team.team_barrier();
          const double sum = exp_shifted_sum(team, row, mx, V_valid);
          Kokkos::single(Kokkos::PerTeam(team),
                         [&] { losses[n] = float(Kokkos::log(sum) - double(target_logit)); });
          finish_row(team, row, V, V_valid, t, sum, grad_scale);
        });
  }

  static void local_max(const float* logits, float* row_max_out, int64_t N, int64_t V,
                        int64_t V_valid) {
    Kokkos::parallel_for(
        "cross_entropy_local_max", rows<E>(N), KOKKOS_LAMBDA(const Team<E>& team) {
          const int64_t n = team.league_rank();
          const float m = V_valid > 0 ? row_max(team, logits + n * V, V_valid)
                                      : -Kokkos::Experimental::infinity_v<float>;
          Kokkos::single(Kokkos::PerTeam(team), [&] { row_max_out[n] = m; });
        });
  }

  static void local_exp(float* logits, const int32_t* targets, const float* row_max_in,
                        double* sum_exp, float* target_logit, int64_t N, int64_t V,
                        int64_t V_valid, int64_t v0) {
    Kokkos::parallel_for(
        "cross_entropy_local_exp", rows<E>(N), KOKKOS_LAMBDA(const Team<E>& team) {
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
        });
  }

  static void local_finish(float* logits, const int32_t* targets, const double* sum_exp,
                           const float* target_logit, float* losses, int64_t N, int64_t V,
                           int64_t V_valid, int64_t v0, float grad_scale) {
    Kokkos::parallel_for(
        "cross_entropy_local_finish", rows<E>(N), KOKKOS_LAMBDA(const Team<E>& team) {
          const int64_t n = team.league_rank();
          Kokkos::single(Kokkos::PerTeam(team), [&] {
            losses[n] = float(Kokkos::log(sum_exp[n]) - double(target_logit[n]));
          });
          const int64_t t = int64_t(targets[n]) - v0;
          finish_row(team, logits + n * V, V, V_valid, t, sum_exp[n], grad_scale);
        });
  }

  static void fill(Backend& b) {
    b.cross_entropy_fused = fused;
    b.cross_entropy_local_max = local_max;
    b.cross_entropy_local_exp = local_exp;
    b.cross_entropy_local_finish = local_finish;
  }
};

void register_cross_entropy(Backend& b, Target t) {
  register_for<CrossEntropy>(b, t);
}

}  // namespace tessera::kernels::kokkos
