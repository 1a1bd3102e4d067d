#include "perf/compute_model.hpp"

#include <algorithm>
#include <cmath>

#include "perf/activation_memory.hpp"
#include "perf/flops.hpp"

namespace tessera {

double gemm_efficiency(const Cluster& c, double m, double n, double k) {
  const double d = std::min({m, n, k});
  return c.gemm_efficiency * d / (d + c.gemm_half_dim);
}

double gemm_seconds(const Cluster& c, double peak, double m, double n, double k, double batch,
                    double element_bytes) {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0) return 0;
  const double compute = 2 * m * n * k * batch / (peak * gemm_efficiency(c, m, n, k));
  const double memory = (m * k + k * n + m * n) * batch * element_bytes / c.memory_bw;
  return std::max(compute, memory);
}

LinearSeconds linear_seconds(const Cluster& c, double peak, double m, double n, double k,
                             double element_bytes) {
  LinearSeconds s;
  s.forward = gemm_seconds(c, peak, m, n, k, 1, element_bytes);
  s.backward = gemm_seconds(c, peak, m, k, n, 1, element_bytes) +  // dX = dY W^T
               gemm_seconds(c, peak, k, n, m, 1, element_bytes);   // dW = X^T dY
  return s;
}

double LayerCompute::recompute(Recompute r) const {
  switch (r) {
    case Recompute::none:
      return 0;
    case Recompute::selective:
      return attn_fwd + score_elementwise_fwd;
    case Recompute::full:
      return forward();
  }
  return 0;
}

double LayerCompute::recompute_flops(Recompute r) const {
  return r == Recompute::full ? flops_fwd : r == Recompute::selective ? attn_flops_fwd : 0;
}

LayerCompute layer_compute(const Workload& w, const Layout& l, const Cluster& cl, bool moe_layer) {
  const ModelConfig& c = w.cfg;
  const double peak = cl.peak(l.precision);
  const double e = activation_element_bytes(l);
  const double t = l.tp, s = double(c.seq_len), d = double(c.head_dim);
  const double T = double(l.micro_batch) * s / l.cp;
  const double C = double(c.d_model);
  const double q = double(c.heads * c.head_dim) / t;
  const double kv = double(std::max<int64_t>(1, c.kv_heads / l.tp) * c.head_dim);
  const bool gated = c.arch == Arch::llama;
  LayerCompute r;
  auto linear = [&](double m, double n, double k, double batch = 1) {
    const LinearSeconds ls = linear_seconds(cl, peak, m, n, k, e);
    r.gemm_fwd += batch * ls.forward;
    r.gemm_bwd += batch * ls.backward;
    r.flops_fwd += 2 * m * n * k * batch;
  };
  linear(T, q + 2 * kv, C);  // QKV
  linear(T, C, q);           // output projection
  if (moe_layer) {
    const double E = w.moe.experts, local = E / l.ep;
    const double Fe = double(w.moe.expert_ffn ? w.moe.expert_ffn : c.ffn_hidden) / t;
    const double tokens_per_expert = T * w.moe.top_k / local;  // per local expert, on average
    linear(T, E, C);                                           // router
    linear(tokens_per_expert, (gated ? 2 : 1) * Fe, C, local);
    linear(tokens_per_expert, C, Fe, local);
  } else {
    const double F = double(c.ffn_hidden) / t;
    linear(T, (gated ? 2 : 1) * F, C);
    linear(T, C, F);
  }
  // Attention core: b x heads/t products over (s/cp) queries and s keys.
  const double heads = double(l.micro_batch) * double(c.heads) / t;
  const double sq = s / l.cp;
  r.attn_flops_fwd = 4 * heads * sq * s * d * attention_work_fraction(w);
  if (w.flash_attention) {
    r.attn_fwd = r.attn_flops_fwd / (peak * gemm_efficiency(cl, sq, s, 2 * d));
    r.attn_bwd = 2.5 * r.attn_fwd;
  } else {
    r.attn_fwd =
        gemm_seconds(cl, peak, sq, s, d, heads, e) + gemm_seconds(cl, peak, sq, d, s, heads, e);
    r.attn_bwd = 2 * r.attn_fwd;
  }
  r.flops_fwd += r.attn_flops_fwd;
  const LayerActivations act = layer_activations(w, l, moe_layer);
  r.elementwise_fwd = 2 * act.total() / cl.memory_bw;
  r.score_elementwise_fwd = 2 * act.scores / cl.memory_bw;
  r.elementwise_bwd = 2 * r.elementwise_fwd;
  return r;
}

HeadCompute head_compute(const Workload& w, const Layout& l, const Cluster& cl) {
  const ModelConfig& c = w.cfg;
  const double peak = cl.peak(l.precision);
  const double e = activation_element_bytes(l);
  const double T = double(l.micro_batch) * double(c.seq_len) / l.cp;
  const double V = double(c.vocab_padded) / l.tp, C = double(c.d_model);
  const LinearSeconds ls = linear_seconds(cl, peak, T, V, C, e);
  // Cross-entropy in fp32 over the logits: write, read for the softmax, write the gradient.
  const double ce = 3 * 4 * T * V / cl.memory_bw;
  const double norm = 4 * e * T * C / cl.memory_bw;  // final norm and embedding lookup
  HeadCompute h;
  h.forward = ls.forward + ce + norm;
  h.backward = ls.backward + ce + 2 * norm;
  h.flops_fwd = 2 * T * double(c.vocab) / l.tp * C;
  return h;
}

double workload_params(const Workload& w) {
  const ModelConfig& c = w.cfg;
  double n = double(c.param_count());
  if (!w.moe.any() || c.moe.enabled()) return n;  // a deck's experts are in param_count()
  const double C = double(c.d_model), mats = c.arch == Arch::llama ? 3 : 2;
  const double Fe = double(w.moe.expert_ffn ? w.moe.expert_ffn : c.ffn_hidden);
  const double dense =
      mats * C * double(c.ffn_hidden) + (c.has_bias() ? double(c.ffn_hidden) + C : 0);
  return n + double(c.layers) * (w.moe.experts * mats * C * Fe + C * w.moe.experts - dense);
}

double attention_work_fraction(const Workload& w) {
  if (!w.causal || !w.flash_attention) return 1;
  const double tiles = std::ceil(double(w.cfg.seq_len) / 128);
  return (1 + 1 / tiles) / 2;
}

double workload_flops_per_token(const Workload& w, AttentionFlops conv) {
  double f = model_flops_per_token(w.cfg);
  if (conv == AttentionFlops::causal)  // perf/flops.hpp counts 12 L s q; keep half of it
    f -= 6.0 * double(w.cfg.layers) * double(w.cfg.seq_len) * double(w.cfg.heads * w.cfg.head_dim);
  // A deck's experts (model.experts) are in model_flops_per_token already: the active FLOPs
  // tessera's runs count for MFU (perf/flops.cpp). --experts describes them here instead.
  if (!w.moe.any() || w.cfg.moe.enabled()) return f;
  const ModelConfig& c = w.cfg;
  const double C = double(c.d_model), mats = c.arch == Arch::llama ? 3 : 2;
  const double Fe = double(w.moe.expert_ffn ? w.moe.expert_ffn : c.ffn_hidden);
  const double dense_mlp = mats * C * double(c.ffn_hidden);
  const double moe_mlp = w.moe.top_k * mats * C * Fe + C * w.moe.experts;
  return f + 6.0 * double(c.layers) * (moe_mlp - dense_mlp);
}

}  // namespace tessera
