// Rotary position embedding, Llama's interleaved-pair convention: one thread per (position,
// pair), the angle in double, the pair rotated by it in every sequence and head of the batch
// (the angle depends on the position only, so it is computed once, not once per sequence).
#include "kernels/kokkos/kokkos.hpp"

namespace tessera::kernels::kokkos {

template <class E>
struct Rope {
  static void rope(float* x, int64_t B, int64_t T, int64_t H, int64_t D, int64_t pos0, float theta,
                   bool inverse) {
    const int64_t half = D / 2;
    Kokkos::parallel_for(
        "rope", range<E>(T * half), TESSERA_LAMBDA(E, (int64_t i) {
          const int64_t j = i % half, t = i / half;
          const double pos = double(pos0 + t);
          const double angle = pos * Kokkos::pow(double(theta), -2.0 * double(j) / double(D));
          const float c = float(Kokkos::cos(angle));
          const float s = inverse ? -float(Kokkos::sin(angle)) : float(Kokkos::sin(angle));
          for (int64_t seq = 0; seq < B; ++seq) {
            float* row = x + (seq * T + t) * H * D;
            for (int64_t h = 0; h < H; ++h) {
              float* p = row + h * D + 2 * j;
              const float a = p[0], b = p[1];
              p[0] = a * c - b * s;
              p[1] = a * s + b * c;
            }
          }
        }));
  }

  // Token n of x[N,H,D] at position pos[n]: one thread per (token, pair).
  static void rope_at(float* x, const int32_t* pos, int64_t N, int64_t H, int64_t D, float theta,
                      bool inverse) {
    const int64_t half = D / 2;
    Kokkos::parallel_for(
        "rope_at", range<E>(N * half), TESSERA_LAMBDA(E, (int64_t i) {
          const int64_t j = i % half, n = i / half;
          const double angle =
              double(pos[n]) * Kokkos::pow(double(theta), -2.0 * double(j) / double(D));
          const float c = float(Kokkos::cos(angle));
          const float s = inverse ? -float(Kokkos::sin(angle)) : float(Kokkos::sin(angle));
          float* row = x + n * H * D;
          for (int64_t h = 0; h < H; ++h) {
            float* p = row + h * D + 2 * j;
            const float a = p[0], b = p[1];
            p[0] = a * c - b * s;
            p[1] = a * s + b * c;
          }
        }));
  }

  static void fill(Backend& b) {
    b.rope = rope;
    b.rope_at = rope_at;
  }
};

void register_rope(Backend& b, Target t) {
  register_for<Rope>(b, t);
}

}  // namespace tessera::kernels::kokkos
