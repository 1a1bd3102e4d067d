// A mixture of experts' routing (model/moe.cpp, doc/moe.md "Routing as kernels"): scores, top-k
// with node-limited routing, capacity, the packed (expert-contiguous) order and its inverse, the
// combine and their backwards. Each kernel evaluates the expressions of the host loops it
// replaced, in their order, so a training run gives the same bits as before:
//  * a token's work (scores, top-k, router gradient) is one thread's loop over the experts;
//  * a sequence's counts are one thread's loop over the sequence's choices in order, per block
//    of experts (all experts on the host, one on a GPU): integers, the same in any cut;
//  * the step's statistics are added in token / sequence order by one thread (a few thousand
//    numbers), from the running totals the caller passes in;
//  * rows move element by element, each element seeing a token's choices in rank order (as the
//    host loops: copies, one multiply-add per choice).
// No atomics and no scratch memory: top-k takes each next expert as the best one after the
// previous in the order (key descending, index ascending), so it needs no "taken" flags.
#include "kernels/kokkos/kokkos.hpp"

namespace tessera::kernels::kokkos {

// Experts one thread counts over a sequence's choices in moe_capacity: all of them on the host
// (one pass over the choices per sequence), one on a GPU (B x E threads).
template <class Exec>
inline constexpr int64_t expert_block = int64_t(1) << 40;
#ifdef KOKKOS_ENABLE_CUDA
template <>
inline constexpr int64_t expert_block<Device> = 1;
#endif

// f(i, j, c) for every row i < rows, choice j < K and column c < C, each element (i, c) seeing
// the choices in order: on a GPU one thread per element, looping over j; on the host a
// thread's piece of rows, for each row and choice the columns as the inner (vectorised) loop.
template <class Exec, class F>
void for_each_row_choice_column(const char* name, int64_t rows_, int64_t K, int64_t C,
                                const F& f) {
  if (rows_ <= 0 || C <= 0) return;
  if constexpr (lanes<Exec> == 1) {
    Kokkos::parallel_for(name, range<Exec>(rows_ * C), TESSERA_LAMBDA(Exec, (int64_t i) {
                           for (int64_t j = 0; j < K; ++j) f(i / C, j, i % C);
                         }));
  } else {
    const int64_t per = C >= 4096 ? 1 : 4096 / C;  // rows of a piece
    Kokkos::parallel_for(name, range<Exec>((rows_ + per - 1) / per), [=](int64_t p) {
      const F g = f;
      const int64_t r1 = rows_ - p * per < per ? rows_ : (p + 1) * per;
      for (int64_t r = p * per; r < r1; ++r)
        for (int64_t j = 0; j < K; ++j) {
#pragma GCC ivdep
          for (int64_t c = 0; c < C; ++c) g(r, j, c);
        }
    });
  }
}

// The selection order: key a of expert i before key b of expert k when higher, equal keys by
// the lower index. Keys are NaN-free (rank_key).
KOKKOS_INLINE_FUNCTION bool before(float a, int64_t i, float b, int64_t k) {
  return a > b || (a == b && i < k);
}
KOKKOS_INLINE_FUNCTION float rank_key(float x) {
  return x != x ? -Kokkos::Experimental::infinity_v<float> : x;
}

template <class E>
struct Routing {
  // ---- scores ----
  static void scores(const float* logits, float* sc, double* lse, double* norm, int64_t N,
                     int64_t Ex, bool sigmoid) {
    Kokkos::parallel_for(
        "moe_scores", range<E>(N), TESSERA_LAMBDA(E, (int64_t n) {
          const float* l = logits + n * Ex;
          float* s = sc + n * Ex;
          float mx = l[0];
          for (int64_t e = 1; e < Ex; ++e) mx = mx < l[e] ? l[e] : mx;
          double sum = 0;
          for (int64_t e = 0; e < Ex; ++e) sum += Kokkos::exp(double(l[e] - mx));
          lse[n] = double(mx) + Kokkos::log(sum);
          if (sigmoid) {
            for (int64_t e = 0; e < Ex; ++e) s[e] = 1.0f / (1.0f + Kokkos::exp(-l[e]));
          } else {
            for (int64_t e = 0; e < Ex; ++e) s[e] = float(Kokkos::exp(double(l[e] - mx)) / sum);
          }
          if (norm) {
            double t = 0;
            for (int64_t e = 0; e < Ex; ++e) t += s[e];
            norm[n] = t;
          }
        }));
  }

  // ---- top-k ----
  // The best of experts [e0, e1) after (pk, pi) in the order (pi < 0: the best), by key(e);
  // -1 when none is left.
  template <class Key>
  KOKKOS_INLINE_FUNCTION static int64_t next_best(const Key& key, int64_t e0, int64_t e1, float pk,
                                                  int64_t pi, float& bk) {
    int64_t best = -1;
    for (int64_t e = e0; e < e1; ++e) {
      const float k = key(e);
      if (pi >= 0 && !before(pk, pi, k, e)) continue;
      if (best < 0 || before(k, e, bk, best)) best = e, bk = k;
    }
    return best;
  }
  // A node's score: the sum in float of its q highest keys, highest first.
  template <class Key>
  KOKKOS_INLINE_FUNCTION static float node_score(const Key& key, int64_t g, int64_t per,
                                                 int64_t q) {
    float sum = 0, pk = 0;
    int64_t pi = -1;
    for (int64_t i = 0; i < q; ++i) {
      float bk = 0;
      pi = next_best(key, g * per, (g + 1) * per, pk, pi, bk);
      sum += bk;
      pk = bk;
    }
    return sum;
  }

  static void top_k(const float* sc, const float* bias, int32_t* choice, float* weight, int64_t N,
                    int64_t Ex, int64_t K, int64_t G, int64_t M, bool normalise) {
    Kokkos::parallel_for(
        "moe_top_k", range<E>(N), TESSERA_LAMBDA(E, (int64_t n) {
          const float* s = sc + n * Ex;
          const auto key = [&](int64_t e) { return rank_key(s[e] + bias[e]); };
          int32_t* out = choice + n * K;
          if (M > 0) {  // node-limited: the M-th best node, then the top-k among kept nodes
            const int64_t per = Ex / G, q = (K + M - 1) / M < per ? (K + M - 1) / M : per;
            float tk = 0;
            int64_t t = -1;
            for (int64_t m = 0; m < M; ++m) {
              int64_t best = -1;
              float bk = 0;
              for (int64_t g = 0; g < G; ++g) {
                const float k = node_score(key, g, per, q);
                if (t >= 0 && !before(tk, t, k, g)) continue;
                if (best < 0 || before(k, g, bk, best)) best = g, bk = k;
              }
              t = best, tk = bk;
            }
            float pk = 0;
            int64_t pi = -1;
            for (int64_t j = 0; j < K; ++j) {
              int64_t best = -1;
              float bk = 0;
              for (int64_t g = 0; g < G; ++g) {
                const bool kept = !before(tk, t, node_score(key, g, per, q), g);
                const float inf = Kokkos::Experimental::infinity_v<float>;
                const auto masked = [&](int64_t e) { return kept ? key(e) : -inf; };
                float gk = 0;
                const int64_t gb = next_best(masked, g * per, (g + 1) * per, pk, pi, gk);
                if (gb >= 0 && (best < 0 || before(gk, gb, bk, best))) best = gb, bk = gk;
              }
              out[j] = int32_t(best);
              pk = bk, pi = best;
            }
          } else {
            float pk = 0;
            int64_t pi = -1;
            for (int64_t j = 0; j < K; ++j) {
              float bk = 0;
              pi = next_best(key, 0, Ex, pk, pi, bk);
              out[j] = int32_t(pi);
              pk = bk;
            }
          }
          if (!weight) return;
          float* w = weight + n * K;
          double sum = 0;
          for (int64_t j = 0; j < K; ++j) {
            w[j] = s[out[j]];
            sum += s[out[j]];
          }
          if (normalise)
            for (int64_t j = 0; j < K; ++j) w[j] = float(double(w[j]) / sum);
        }));
  }

  // ---- capacity and the packed order ----
  static void capacity(const int32_t* choice, int32_t* load, int32_t* kept, int32_t* row,
                       int64_t B, int64_t T, int64_t K, int64_t Ex, int64_t cap, int64_t first,
                       int64_t count) {
    constexpr int64_t W = expert_block<E>;
    const int64_t blocks = (Ex + W - 1) / W;
    Kokkos::parallel_for(
        "moe_capacity", range<E>(B * blocks), TESSERA_LAMBDA(E, (int64_t i) {
          const int64_t b = i / blocks, e0 = i % blocks * W, e1 = Ex - e0 < W ? Ex : e0 + W;
          int32_t* used = load + b * Ex;
          int32_t* mine = kept + b * Ex;
          for (int64_t e = e0; e < e1; ++e) used[e] = 0, mine[e] = 0;
          for (int64_t n = b * T; n < (b + 1) * T; ++n) {
            const bool own = n >= first && n < first + count;
            for (int64_t j = 0; j < K; ++j) {
              const int64_t e = choice[n * K + j];
              if (e < e0 || e >= e1) continue;
              const bool keep = used[e]++ < cap;
              row[n * K + j] = keep && own ? mine[e]++ : -1;
            }
          }
        }));
  }

  static void balance(const float* sc, const double* norm, const int32_t* load, float* f,
                      double* aux, int64_t B, int64_t T, int64_t K, int64_t Ex) {
    Kokkos::parallel_for(
        "moe_balance", range<E>(B * Ex), TESSERA_LAMBDA(E, (int64_t i) {
          const int64_t b = i / Ex, e = i % Ex;
          const float fe = float(double(Ex) / double(K * T) * double(load[i]));
          f[i] = fe;
          if (!aux) return;
          double P = 0;
          for (int64_t n = b * T; n < (b + 1) * T; ++n)
            P += sc[n * Ex + e] / (norm ? norm[n] : 1.0);
          aux[i] = fe * P / double(T);
        }));
  }

  static void pack(const int32_t* choice, int32_t* kept, int32_t* offset, int32_t* row, int64_t B,
                   int64_t T, int64_t K, int64_t Ex) {
    Kokkos::parallel_for(
        "moe_pack_offsets", range<E>(1), TESSERA_LAMBDA(E, (int64_t) {
          int32_t run = 0;
          for (int64_t e = 0; e < Ex; ++e) {
            offset[e] = run;
            for (int64_t b = 0; b < B; ++b) {
              const int32_t k = kept[b * Ex + e];
              kept[b * Ex + e] = run;
              run += k;
            }
          }
          offset[Ex] = run;
        }));
    Kokkos::parallel_for(
        "moe_pack_rows", range<E>(B * T * K), TESSERA_LAMBDA(E, (int64_t i) {
          if (row[i] >= 0) row[i] += kept[i / K / T * Ex + choice[i]];
        }));
  }

  static void route_stats(const double* lse, const int32_t* load, const double* aux,
                          const int32_t* outside, double* stats, int64_t B, int64_t T, int64_t K,
                          int64_t Ex, int64_t cap, double z0, double aux0, int64_t first,
                          int64_t count, int64_t lo, int64_t hi) {
    Kokkos::parallel_for(
        "moe_route_stats", range<E>(1), TESSERA_LAMBDA(E, (int64_t) {
          int64_t dropped = 0;
          for (int64_t e = 0; e < Ex; ++e) {
            int64_t sum = 0;
            for (int64_t b = 0; b < B; ++b) {
              const int64_t u = load[b * Ex + e];
              sum += u;
              dropped += u > cap ? u - cap : 0;
            }
            stats[e] = double(sum);
          }
          stats[Ex] = double(dropped);
          double z = z0;
          for (int64_t n = 0; n < B * T; ++n) z += lse[n] * lse[n];
          stats[Ex + 1] = z;
          double a = aux0;
          if (aux)
            for (int64_t b = 0; b < B; ++b) {
              double s = 0;
              for (int64_t e = 0; e < Ex; ++e) s += aux[b * Ex + e];
              a += s;
            }
          stats[Ex + 2] = a;
          int64_t off = 0;
          if (outside)
            for (int64_t i = first * K; i < (first + count) * K; ++i)
              off += outside[i] < lo || outside[i] >= hi ? 1 : 0;
          stats[Ex + 3] = double(off);
        }));
  }

  // ---- moving rows ----
  static void gather(const float* x, const int32_t* row, float* packed, int64_t first,
                     int64_t count, int64_t K, int64_t C) {
    for_each_row_choice_column<E>(
        "moe_gather", count, K, C, TESSERA_LAMBDA(E, (int64_t i, int64_t j, int64_t c) {
          const int64_t n = first + i;
          if (const int32_t r = row[n * K + j]; r >= 0) packed[r * C + c] = x[n * C + c];
        }));
  }

  static void combine(const float* packed, const int32_t* row, const float* weight, float* y,
                      int64_t first, int64_t count, int64_t y_first, int64_t K, int64_t C) {
    for_each_row_choice_column<E>(
        "moe_combine", count, K, C, TESSERA_LAMBDA(E, (int64_t i, int64_t j, int64_t c) {
          const int64_t n = first + i;
          if (const int32_t r = row[n * K + j]; r >= 0)
            y[(n - y_first) * C + c] += (weight ? weight[n * K + j] : 1.0f) * packed[r * C + c];
        }));
  }

  static void combine_backward(const float* dy, const float* packed, const int32_t* row,
                               const float* weight, float* d_packed, float* dweight,
                               int64_t first, int64_t count, int64_t dy_first, int64_t K,
                               int64_t C) {
    for_each_row_choice_column<E>(
        "moe_combine_backward", count, K, C, TESSERA_LAMBDA(E, (int64_t i, int64_t j, int64_t c) {
          const int64_t n = first + i;
          if (const int32_t r = row[n * K + j]; r >= 0)
            d_packed[r * C + c] = weight[n * K + j] * dy[(n - dy_first) * C + c];
        }));
    Kokkos::parallel_for(
        "moe_combine_backward_weight", range<E>(count * K), TESSERA_LAMBDA(E, (int64_t i) {
          const int64_t n = first + i / K;
          const int32_t r = row[first * K + i];
          double dot = 0;
          if (r >= 0) {
            const float* o = packed + r * C;
            const float* d = dy + (n - dy_first) * C;
            for (int64_t c = 0; c < C; ++c) dot += double(d[c]) * o[c];
          }
          dweight[first * K + i] = float(dot);
        }));
  }

  // ---- the router's backward ----
  static void router_backward(const float* logits, const float* sc, const int32_t* choice,
                              const float* weight, const float* dw, const float* f, float* dl,
                              int64_t first, int64_t count, int64_t T, int64_t Ex, int64_t K,
                              bool sigmoid, double aux, double zc) {
    Kokkos::parallel_for(
        "moe_router_backward", range<E>(count), TESSERA_LAMBDA(E, (int64_t i) {
          const int64_t n = first + i;
          const float* s = sc + n * Ex;
          const int32_t* ch = choice + n * K;
          const float* dwn = dw + n * K;
          const float* wn = weight + n * K;
          const float* fb = f ? f + (n / T) * Ex : nullptr;
          // The combine weights: softmax w_j = s_e, sigmoid w_j = s_e / (sum of the chosen s).
          double csum = 0, cdot = 0;
          if (sigmoid)
            for (int64_t j = 0; j < K; ++j) csum += s[ch[j]], cdot += double(dwn[j]) * wn[j];
          // The balancing loss (sigmoid: through the normalisation of the scores).
          double asum = 0, adot = 0;
          if (aux > 0 && sigmoid) {
            for (int64_t e = 0; e < Ex; ++e) asum += s[e];
            for (int64_t e = 0; e < Ex; ++e) adot += aux * fb[e] * s[e] / asum;
          }
          // d(objective)/d(score e), built as the host loop built it, term by term.
          const auto ds = [&](int64_t e) {
            double v = 0.0;
            for (int64_t j = 0; j < K; ++j)
              if (ch[j] == e) v += sigmoid ? (double(dwn[j]) - cdot) / csum : double(dwn[j]);
            if (aux > 0) {
              if (!sigmoid) v += aux * fb[e];
              else v += (aux * fb[e] - adot) / asum;
            }
            return v;
          };
          float* dn = dl + i * Ex;
          if (!sigmoid) {
            double dot = 0;
            for (int64_t e = 0; e < Ex; ++e) dot += ds(e) * s[e];
            for (int64_t e = 0; e < Ex; ++e) dn[e] = float(s[e] * (ds(e) - dot));
          } else {
            for (int64_t e = 0; e < Ex; ++e) dn[e] = float(ds(e) * s[e] * (1.0 - s[e]));
          }
          if (zc > 0) {  // logsumexp and softmax of the logits, as moe_scores computes them
            const float* l = logits + n * Ex;
            float mx = l[0];
            for (int64_t e = 1; e < Ex; ++e) mx = mx < l[e] ? l[e] : mx;
            double sum = 0;
            for (int64_t e = 0; e < Ex; ++e) sum += Kokkos::exp(double(l[e] - mx));
            const double z = double(mx) + Kokkos::log(sum);
            for (int64_t e = 0; e < Ex; ++e) {
              const float p = float(Kokkos::exp(double(l[e] - mx)) / sum);
              dn[e] += float(zc * z * p);
            }
          }
        }));
  }

  static void fill(Backend& b) {
    b.moe_scores = scores;
    b.moe_top_k = top_k;
    b.moe_capacity = capacity;
    b.moe_balance = balance;
    b.moe_pack = pack;
    b.moe_route_stats = route_stats;
    b.moe_gather = gather;
    b.moe_combine = combine;
    b.moe_combine_backward = combine_backward;
    b.moe_router_backward = router_backward;
  }
};

void register_routing(Backend& b, Target t) {
  register_for<Routing>(b, t);
}

}  // namespace tessera::kernels::kokkos
