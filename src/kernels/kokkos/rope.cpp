// Rotary position embedding, Llama's interleaved-pair convention: one thread per (position,
// pair), the angle in double, the pair rotated by it in every sequence and head of the batch
// (the angle depends on the position only, so it is computed once, not once per sequence).
// With y16 the rotated pair is written rounded to bf16 there (the fp32 rotation, rounded once:
// a 16-bit run's saved q and k) and x is left as it was.
#include "kernels/kokkos/kokkos.hpp"
#include "tensor/half.hpp"

namespace tessera::kernels::kokkos {

// The pair at x[i], x[i + 1] rotated by (c, s): in place, or rounded into y16.
KOKKOS_INLINE_FUNCTION void rotate(float* x, uint16_t* y16, int64_t i, float c, float s) {
  const float a = x[i], b = x[i + 1];
  const float u = a * c - b * s, w = a * s + b * c;
  if (y16) {
    y16[i] = half::to_bf16(u);
    y16[i + 1] = half::to_bf16(w);
  } else {
    x[i] = u;
    x[i + 1] = w;
  }
}

template <class E>
struct Rope {
  static void rope(float* x, uint16_t* y16, int64_t B, int64_t T, int64_t H, int64_t D,
                   int64_t pos0, float theta, bool inverse) {
    const int64_t half = D / 2;
    Kokkos::parallel_for(
        "rope", range<E>(T * half), TESSERA_LAMBDA(E, (int64_t i) {
          const int64_t j = i % half, t = i / half;
          const double pos = double(pos0 + t);
          const double angle = pos * Kokkos::pow(double(theta), -2.0 * double(j) / double(D));
          const float c = float(Kokkos::cos(angle));
          const float s = inverse ? -float(Kokkos::sin(angle)) : float(Kokkos::sin(angle));
          for (int64_t seq = 0; seq < B; ++seq) {
            const int64_t row = (seq * T + t) * H * D;
            for (int64_t h = 0; h < H; ++h) rotate(x, y16, row + h * D + 2 * j, c, s);
          }
        }));
  }

  // Token n of x[N,H,D] at position pos[n]: one thread per (token, pair).
  static void rope_at(float* x, uint16_t* y16, const int32_t* pos, int64_t N, int64_t H,
                      int64_t D, float theta, bool inverse) {
    const int64_t half = D / 2;
    Kokkos::parallel_for(
        "rope_at", range<E>(N * half), TESSERA_LAMBDA(E, (int64_t i) {
          const int64_t j = i % half, n = i / half;
          const double angle =
              double(pos[n]) * Kokkos::pow(double(theta), -2.0 * double(j) / double(D));
          const float c = float(Kokkos::cos(angle));
          const float s = inverse ? -float(Kokkos::sin(angle)) : float(Kokkos::sin(angle));
          for (int64_t h = 0; h < H; ++h) rotate(x, y16, n * H * D + h * D + 2 * j, c, s);
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
