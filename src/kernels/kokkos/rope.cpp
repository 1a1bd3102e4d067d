// Rotary position embedding, Llama's interleaved-pair convention: one thread per (position,
// pair), the angle in double, the pair rotated by it in every sequence and head of the batch
// (the angle depends on the position only, so it is computed once, not once per sequence).
// With y16 the rotated pair is written rounded to bf16 there (the fp32 rotation, rounded once:
// a bf16 run's kept q and k) and x is left as it was.
#include "kernels/kokkos/kokkos.hpp"
#include "tensor/half.hpp"

namespace tessera::kernels::kokkos {

// The pair at x[i], x[i + 1] rotated by (c, s) and rounded into y16.
KOKKOS_INLINE_FUNCTION void rotate_into(const float* x, uint16_t* y16, int64_t i, float c,
                                        float s) {
  const float a = x[i], b = x[i + 1];
  y16[i] = half::to_bf16(a * c - b * s);
  y16[i + 1] = half::to_bf16(a * s + b * c);
}

template <class E>
struct Rope {
  // In place, as before the bf16 output existed (the same code, so fp32 runs keep their bits).
  static void rope_in_place(float* x, int64_t B, int64_t T, int64_t H, int64_t D, int64_t pos0,
                            float theta, bool inverse) {
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
  static void rope_at_in_place(float* x, const int32_t* pos, int64_t N, int64_t H, int64_t D,
                               float theta, bool inverse) {
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

  // The rotation of x written rounded to bf16 into y16 (x unchanged): q and k of a bf16 run.
  static void rope_rounded(const float* x, uint16_t* y16, int64_t B, int64_t T, int64_t H,
                           int64_t D, int64_t pos0, float theta, bool inverse) {
    const int64_t half = D / 2;
    Kokkos::parallel_for(
        "rope_bf16", range<E>(T * half), TESSERA_LAMBDA(E, (int64_t i) {
          const int64_t j = i % half, t = i / half;
          const double pos = double(pos0 + t);
          const double angle = pos * Kokkos::pow(double(theta), -2.0 * double(j) / double(D));
          const float c = float(Kokkos::cos(angle));
          const float s = inverse ? -float(Kokkos::sin(angle)) : float(Kokkos::sin(angle));
          for (int64_t seq = 0; seq < B; ++seq)
            for (int64_t h = 0; h < H; ++h)
              rotate_into(x, y16, (seq * T + t) * H * D + h * D + 2 * j, c, s);
        }));
  }

  static void rope_at_rounded(const float* x, uint16_t* y16, const int32_t* pos, int64_t N,
                              int64_t H, int64_t D, float theta, bool inverse) {
    const int64_t half = D / 2;
    Kokkos::parallel_for(
        "rope_at_bf16", range<E>(N * half), TESSERA_LAMBDA(E, (int64_t i) {
          const int64_t j = i % half, n = i / half;
          const double angle =
              double(pos[n]) * Kokkos::pow(double(theta), -2.0 * double(j) / double(D));
          const float c = float(Kokkos::cos(angle));
          const float s = inverse ? -float(Kokkos::sin(angle)) : float(Kokkos::sin(angle));
          for (int64_t h = 0; h < H; ++h) rotate_into(x, y16, n * H * D + h * D + 2 * j, c, s);
        }));
  }

  static void rope(float* x, uint16_t* y16, int64_t B, int64_t T, int64_t H, int64_t D,
                   int64_t pos0, float theta, bool inverse) {
    if (y16) return rope_rounded(x, y16, B, T, H, D, pos0, theta, inverse);
    rope_in_place(x, B, T, H, D, pos0, theta, inverse);
  }
  static void rope_at(float* x, uint16_t* y16, const int32_t* pos, int64_t N, int64_t H,
                      int64_t D, float theta, bool inverse) {
    if (y16) return rope_at_rounded(x, y16, pos, N, H, D, theta, inverse);
    rope_at_in_place(x, pos, N, H, D, theta, inverse);
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
