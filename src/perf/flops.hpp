// FLOP accounting shared by run reports (MFU) and, later, the planner.
//
// Model FLOPs per trained token = 6 * (parameters that take part in a matrix multiply,
// output projection over the real vocabulary included, embedding lookups excluded)
// + 12 * L * T * (heads * head_dim) for the attention scores and weighted sum
// (forward 4*T*d per layer, backward twice that; Megatron's accounting, without halving
// for the causal mask). This is the numerator of MFU.
#pragma once

#include "model/config.hpp"
#include "tensor/tensor.hpp"

namespace tessera {

double matmul_params(const ModelConfig& cfg);           // weights used in GEMMs per token
double model_flops_per_token(const ModelConfig& cfg);  // training (forward + backward)

// The measured GEMM rate of this process (FLOP/s) with operands of the given dtype (fp32
// accumulation), on square 1536-element matrices.
double measure_gemm_flops(DType operands = DType::f32);

}  // namespace tessera
