// FLOP accounting shared by run reports (MFU) and, later, the planner.
//
// Model FLOPs per trained token = 6 * (parameters that take part in a matrix multiply,
// output projection over the real vocabulary included, embedding lookups excluded)
// + 12 * L * T * (heads * head_dim) for the attention scores and weighted sum
// (forward 4*T*d per layer, backward twice that; Megatron's accounting, without halving
// for the causal mask). This is the numerator of MFU. A mixture-of-experts block counts its
// router and the experts a token takes (top_k routed + shared): active FLOPs.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.hpp"
#include "tensor/tensor.hpp"

namespace tessera {

double matmul_params(const ModelConfig& cfg);           // weights used in GEMMs per token
double model_flops_per_token(const ModelConfig& cfg);  // training (forward + backward)
// Forward FLOPs per trained token that activation recompute repeats (cfg.recompute), the
// model cut into chunks of chunk_layers[k] blocks (train.recompute_layers counts per chunk):
// full reruns each recomputed block's forward, 2 x its GEMM weights + 4 T (heads x head_dim)
// for the attention core; selective reruns the attention core of every block (the MLP
// activation it also rebuilds is element-wise, which no FLOP count includes). Hardware
// FLOPs (HFU's numerator) are the model FLOPs plus these.
double recompute_flops_per_token(const ModelConfig& cfg, const std::vector<int64_t>& chunk_layers);

// The measured GEMM rate of this process (FLOP/s) with operands of the given dtype (fp32
// accumulation), on square 1536-element matrices.
double measure_gemm_flops(DType operands = DType::f32);

}  // namespace tessera
