// Array conversions between f32 and the 16-bit floating types (scalar rules in tensor/half.hpp).
#include "kernels/backend.hpp"
#include "kernels/cpu/half.hpp"

namespace tessera::kernels::cpu {

void f32_to_bf16(const float* x, uint16_t* y, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = to_bf16(x[i]);
}

void bf16_to_f32(const uint16_t* x, float* y, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = from_bits(uint32_t(x[i]) << 16);
}

void f32_to_f16(const float* x, uint16_t* y, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = to_f16(x[i]);
}

void f16_to_f32(const uint16_t* x, float* y, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = from_f16(x[i]);
}

void register_cast(Backend& b) {
  b.f32_to_bf16 = f32_to_bf16;
  b.bf16_to_f32 = bf16_to_f32;
  b.f32_to_f16 = f32_to_f16;
  b.f16_to_f32 = f16_to_f32;
}

}  // namespace tessera::kernels::cpu
