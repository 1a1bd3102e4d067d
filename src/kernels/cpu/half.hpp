// The array conversions of cast.cpp (scalar rules in tensor/half.hpp), for the CPU kernels
// that widen 16-bit operands.
#pragma once

#include <cstdint>

#include "tensor/half.hpp"

namespace tessera::kernels::cpu {

using half::bits;
using half::from_bits;
using half::to_bf16;
using half::to_f16;
using half::from_f16;

void f32_to_bf16(const float* x, uint16_t* y, int64_t n);
void bf16_to_f32(const uint16_t* x, float* y, int64_t n);
void f32_to_f16(const float* x, uint16_t* y, int64_t n);
void f16_to_f32(const uint16_t* x, float* y, int64_t n);

}  // namespace tessera::kernels::cpu
