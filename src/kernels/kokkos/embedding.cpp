// Token/position embedding lookup and its scatter-add backward. Ids may repeat, so backward is
// parallel over columns, each summed over the tokens in order: race-free and deterministic.
#include "kernels/kokkos/kokkos.hpp"

namespace tessera::kernels::kokkos {

template <class E>
struct Embedding {
  // out[n, :] = table[ids[n] - v0, :] for ids in [v0, v0 + rows), zeros elsewhere.
  static void forward_range(const int32_t* ids, const float* table, float* out, int64_t N,
                            int64_t C, int64_t v0, int64_t rows_) {
    Kokkos::parallel_for(
        "embedding_forward", rows<E>(N), TESSERA_LAMBDA(E, (const Team<E>& team) {
          const int64_t n = team.league_rank();
          const int64_t r = int64_t(ids[n]) - v0;
          float* dst = out + n * C;
          const bool inside = r >= 0 && r < rows_;
          const float* src = table + (inside ? r : 0) * C;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C),
                               [&](int64_t c) { dst[c] = inside ? src[c] : 0.0f; });
        }));
  }

  // dtable[ids[n] - v0, :] += dout[n, :] for ids in [v0, v0 + rows).
  static void backward_range(const int32_t* ids, const float* dout, float* dtable, int64_t N,
                             int64_t C, int64_t v0, int64_t rows_) {
    constexpr int64_t W = column_block<E>;
    Kokkos::parallel_for(
        "embedding_backward", range<E>(column_blocks<E>(C)), TESSERA_LAMBDA(E, (int64_t blk) {
          const int64_t c0 = blk * W, w = C - c0 < W ? C - c0 : W;
          for (int64_t n = 0; n < N; ++n) {
            const int64_t r = int64_t(ids[n]) - v0;
            if (r < 0 || r >= rows_) continue;
            float* dst = dtable + r * C + c0;
            const float* src = dout + n * C + c0;
            for_lanes<W>(w, [&](int64_t k) { dst[k] += src[k]; });
          }
        }));
  }

  // The whole table: every id is a row (ids are checked against the table by the caller).
  static void forward(const int32_t* ids, const float* table, float* out, int64_t N, int64_t C) {
    forward_range(ids, table, out, N, C, 0, INT64_MAX);
  }
  static void backward(const int32_t* ids, const float* dout, float* dtable, int64_t N,
                       int64_t C) {
    backward_range(ids, dout, dtable, N, C, 0, INT64_MAX);
  }

  static void fill(Backend& b) {
    b.embedding_forward = forward;
    b.embedding_backward = backward;
    b.embedding_forward_range = forward_range;
    b.embedding_backward_range = backward_range;
  }
};

void register_embedding(Backend& b, Target t) {
  register_for<Embedding>(b, t);
}

}  // namespace tessera::kernels::kokkos
