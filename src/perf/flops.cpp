#include "perf/flops.hpp"

#include <algorithm>
#include <chrono>
#include <vector>

#include "kernels/kernels.hpp"

namespace tessera {

double matmul_params(const ModelConfig& c) {
  const double C = double(c.d_model), F = double(c.ffn_hidden);
  const double qd = double(c.heads * c.head_dim), kvd = double(c.kv_heads * c.head_dim);
  const double maps = c.arch == Arch::llama ? 3 : 2;
  const double per_layer = C * qd + 2 * C * kvd + qd * C + maps * C * F;
  // A mixture-of-experts block: the router and the experts a token takes (active FLOPs).
  const double moe = double(c.moe_blocks());
  const double active = double(c.moe.experts) * C +
                        double(c.moe.top_k + c.moe.shared) * maps * C * double(c.moe.ffn);
  return double(c.layers) * per_layer + moe * (active - maps * C * F) + double(c.vocab) * C;
}

double model_flops_per_token(const ModelConfig& c) {
  return 6.0 * matmul_params(c) +
         12.0 * double(c.layers) * double(c.seq_len) * double(c.heads * c.head_dim);
}

double recompute_flops_per_token(const ModelConfig& c, const std::vector<int64_t>& chunk_layers) {
  const double core = 4.0 * double(c.seq_len) * double(c.heads * c.head_dim);
  if (c.recompute == Recompute::selective) return double(c.layers) * core;
  if (c.recompute != Recompute::full || c.layers == 0) return 0;
  const double gemm = (matmul_params(c) - double(c.vocab) * double(c.d_model)) / double(c.layers);
  double blocks = 0;
  for (int64_t n : chunk_layers)
    for (int64_t i = 0; i < n; ++i) blocks += c.block_recompute(i) == Recompute::full;
  return blocks * (2 * gemm + core);
}

double measure_gemm_flops(DType operands) {
  constexpr int64_t n = 1536;
  std::vector<float> a(size_t(n * n), 0.5f), b(size_t(n * n), 0.25f), c(size_t(n * n));
  std::vector<uint16_t> ah(a.size()), bh(b.size());
  Tensor A = view_of(a.data(), {n, n}), B = view_of(b.data(), {n, n});
  if (operands != DType::f32) {  // the GEMM training runs: 16-bit operands, fp32 output
    const Tensor a16 = view_of(ah.data(), operands, {n, n}), b16 = view_of(bh.data(), operands, {n, n});
    kernels::cast(A, a16, n * n);
    kernels::cast(B, b16, n * n);
    A = a16, B = b16;
  }
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    kernels::matmul(A, B, view_of(c.data(), {n, n}), n, n, n, false, false);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::min(best, s);  // rep 0 warms up
  }
  return 2.0 * double(n) * double(n) * double(n) / best;
}

}  // namespace tessera
