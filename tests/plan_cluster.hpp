// The planner tests' cluster file: 8 accelerators per node, pods of 4 nodes; the network is
// 10x slower than the node and the spine 2x slower than the network.
#pragma once

namespace tessera::test {

inline const char* const kPlanCluster = R"(
[cluster]
name = test
[accelerator]
peak_bf16_tflops = 100
peak_fp32_tflops = 10
memory_gb = 80
memory_bw_gbs = 1000
gemm_efficiency = 0.5
gemm_half_dim = 100
[node]
accelerators = 8
bw_gbs = 100
latency_us = 0
[network]
bw_gbs = 10
latency_us = 0
[pod]
nodes = 4
oversubscription = 2
)";

}  // namespace tessera::test
