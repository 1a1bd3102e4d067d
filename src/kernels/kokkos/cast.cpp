// Array conversions between f32 and the 16-bit floating types (scalar rules in tensor/half.hpp).
#include "kernels/kokkos/kokkos.hpp"
#include "tensor/half.hpp"

namespace tessera::kernels::kokkos {

template <class E>
struct Cast {
  static void f32_to_bf16(const float* x, uint16_t* y, int64_t n) {
    Kokkos::parallel_for("f32_to_bf16", range<E>(n),
                         TESSERA_LAMBDA(E, (int64_t i) { y[i] = half::to_bf16(x[i]); }));
  }
  static void bf16_to_f32(const uint16_t* x, float* y, int64_t n) {
    Kokkos::parallel_for("bf16_to_f32", range<E>(n),
                         TESSERA_LAMBDA(E, (int64_t i) { y[i] = half::from_bf16(x[i]); }));
  }
  static void f32_to_f16(const float* x, uint16_t* y, int64_t n) {
    Kokkos::parallel_for("f32_to_f16", range<E>(n),
                         TESSERA_LAMBDA(E, (int64_t i) { y[i] = half::to_f16(x[i]); }));
  }
  static void f16_to_f32(const uint16_t* x, float* y, int64_t n) {
    Kokkos::parallel_for("f16_to_f32", range<E>(n),
                         TESSERA_LAMBDA(E, (int64_t i) { y[i] = half::from_f16(x[i]); }));
  }

  static void fill(Backend& b) {
    b.f32_to_bf16 = f32_to_bf16;
    b.bf16_to_f32 = bf16_to_f32;
    b.f32_to_f16 = f32_to_f16;
    b.f16_to_f32 = f16_to_f32;
  }
};

void register_cast(Backend& b, Target t) {
  register_for<Cast>(b, t);
}

}  // namespace tessera::kernels::kokkos
