#include "perf/memory.hpp"

namespace tessera {

const char* zero_formula(int stage, bool mixed) {
  static const char* fp32[] = {"16Psi", "8Psi + 12Psi/N", "4Psi + 12Psi/N", "16Psi/N"};
  static const char* mixed_formulas[] = {"16Psi", "4Psi + 12Psi/N", "2Psi + 14Psi/N", "16Psi/N"};
  return (mixed ? mixed_formulas : fp32)[stage];
}

std::string model_state_formula(const RankLayout& r) {
  std::string f = zero_formula(r.zero, false);
  if (r.model.compute != DType::f32)
    f += std::string(" + ") + dtype_name(r.model.compute) + " compute copy 2Psi" +
         (r.zero < 3 ? "" : "/N");
  return f;
}

// Bytes per element of q, k, v and the attention output: 2 where the attention core keeps them
// in bf16 (a bf16 run without context parallelism, model/attention.cpp), else 4.
double attention_io_bytes(const ModelConfig& cfg) {
  return cfg.compute == DType::bf16 && cfg.cp.size == 1 ? 2 : 4;
}

double activation_bytes_per_block(const ModelConfig& cfg, int64_t batch) {
  // Tokens this rank holds: a context-parallel rank holds seq_len / cp of each sequence.
  const double t = double(cfg.tp.size), N = double(batch * cfg.seq_local()), C = double(cfg.d_model);
  const double R = cfg.tp.sequence_parallel && cfg.tp.size > 1 ? N / t : N;
  const bool layernorm = cfg.arch == Arch::gpt2;
  const double ob = cfg.operand_bytes();  // what feeds GEMMs only (model/block.cpp, mlp.cpp)
  double e = 2 * R * C + (layernorm ? 4 : 2) * R;  // fp32: h, out; the norms' statistics
  e += double(batch) * double(cfg.heads) / t * double(cfg.seq_local());  // lse
  e += (cfg.arch == Arch::llama ? 2 : 1) * double(cfg.ffn_hidden) / t * N;  // (gate,) up
  const double qkvo = (2 * double(cfg.heads) + 2 * double(cfg.kv_heads)) / t *
                      double(cfg.head_dim) * N;  // q, k, v, the attention output
  return 4 * e + attention_io_bytes(cfg) * qkvo +
         ob * (2 * R * C + double(cfg.ffn_hidden) / t * N);  // n1, n2; act
}

namespace {

// The attention's activations: q, k, v, its output (attention_io_bytes) and the log-sum-exp
// (fp32).
double attention_bytes(const ModelConfig& cfg, int64_t batch) {
  const double t = double(cfg.tp.size), N = double(batch * cfg.seq_local());
  return attention_io_bytes(cfg) *
             ((2 * double(cfg.heads) + 2 * double(cfg.kv_heads)) / t * double(cfg.head_dim) * N) +
         4 * double(batch) * double(cfg.heads) / t * double(cfg.seq_local());
}

// Bytes of the attention's pieces selective recompute drops: its output and lse.
double selective_attention(const ModelConfig& cfg, int64_t batch) {
  const double t = double(cfg.tp.size), N = double(batch * cfg.seq_local());
  return attention_io_bytes(cfg) * double(cfg.heads) / t * double(cfg.head_dim) * N +
         4 * double(batch) * double(cfg.heads) / t * double(cfg.seq_local());
}

// ... and of the MLP's: a dense block's activation output (in the operand dtype), or a
// mixture of experts' (model/moe.cpp): the routed experts' (fp32, the expert side's ep N K rows)
// and the shared experts' (as a dense MLP's).
double selective_mlp(const ModelConfig& cfg, int64_t batch, bool moe) {
  const double t = double(cfg.tp.size), N = double(batch * cfg.seq_local());
  if (!moe) return cfg.operand_bytes() * double(cfg.ffn_hidden) / t * N;
  const double Fe = double(cfg.moe.ffn),
               Rx = double(cfg.experts_held.size) * N * double(cfg.moe.top_k);
  return 4 * Rx * Fe + cfg.operand_bytes() * double(cfg.moe.shared) * Fe / t * N;
}

double residual_rows(const ModelConfig& cfg, int64_t batch) {
  const double N = double(batch * cfg.seq_local());
  return cfg.tp.sequence_parallel && cfg.tp.size > 1 ? N / double(cfg.tp.size) : N;
}

// Everything a block keeps without recompute.
double block_bytes(const ModelConfig& cfg, int64_t batch, bool moe) {
  return activation_bytes_per_block(cfg, batch) + (moe ? moe_block_extra_bytes(cfg, batch) : 0);
}

}  // namespace

double block_kept_bytes(const ModelConfig& cfg, int64_t batch, Recompute mode, bool moe) {
  switch (mode) {
    case Recompute::none:
      return block_bytes(cfg, batch, moe);
    case Recompute::selective:
      return block_bytes(cfg, batch, moe) - selective_attention(cfg, batch) -
             selective_mlp(cfg, batch, moe);
    case Recompute::full:
      return 4 * residual_rows(cfg, batch) * double(cfg.d_model);
  }
  return 0;
}

double rebuilt_bytes(const ModelConfig& cfg, int64_t batch) {
  // Which kinds of block rebuild (model/block.hpp, Block::Rebuilt: the attention's set is
  // common, the rest is one set per kind).
  bool dense = false, moe = false;
  for (int64_t i = 0; i < cfg.layers; ++i)
    if (cfg.block_recompute(i) != Recompute::none) (cfg.moe.is_moe(i) ? moe : dense) = true;
  if (!dense && !moe) return 0;
  if (cfg.recompute == Recompute::selective)
    return selective_attention(cfg, batch) + (dense ? selective_mlp(cfg, batch, false) : 0) +
           (moe ? selective_mlp(cfg, batch, true) : 0);
  return (dense ? block_bytes(cfg, batch, false) : 0) +
         (moe ? block_bytes(cfg, batch, true) - (dense ? attention_bytes(cfg, batch) : 0) : 0);
}

double chunk_kept_bytes(const ModelConfig& cfg, int64_t batch, int64_t blocks, int64_t first) {
  double bytes = 0;
  for (int64_t i = 0; i < blocks; ++i)
    bytes += block_kept_bytes(cfg, batch, cfg.block_recompute(i), cfg.moe.is_moe(first + i));
  return bytes;
}

double moe_block_extra_bytes(const ModelConfig& cfg, int64_t batch) {
  if (!cfg.moe.enabled()) return 0;
  const double t = double(cfg.tp.size), N = double(batch * cfg.seq_local()),
               C = double(cfg.d_model);
  const double E = double(cfg.moe.experts), K = double(cfg.moe.top_k), Fe = double(cfg.moe.ffn);
  const double ep = double(cfg.experts_held.size), mats = cfg.arch == Arch::llama ? 3 : 2;
  const double ob = cfg.operand_bytes();
  // No dense MLP ((gate,) up fp32, act in the operand dtype), and n2 in fp32 (the router's input).
  double e = -(mats - 1 + ob / 4) * double(cfg.ffn_hidden) / t * N +
             (4 - ob) / 4 * residual_rows(cfg, batch) * C;
  e += (mats - 1 + ob / 4) * double(cfg.moe.shared) * Fe / t * N;  // the shared experts' MLP
  // logits, scores; choice, row, weight (over whole sequences: the routing's tokens under
  // context parallelism); load fractions
  const double Nw = double(batch * cfg.seq_len);
  e += 2 * Nw * E + 3 * Nw * K + double(batch) * E;
  e += 2 * N * K * C;                                 // packed rows in and out
  const double Rx = ep * N * K;                       // expert side, worst case
  if (ep > 1) e += 2 * Rx * C;                        // its rows in and out
  e += mats * Rx * Fe;                                // (gate,) up, activation
  if (cfg.moe.two_level) {  // model/moe_two_level.cpp: per token and node its row sent (i32);
    const double D = double(cfg.moe.nodes);      // as relay, each received row's choices (i32)
    e += N * D + 2 * D * N * K + D * N * K * C;  // and weights, the node's expert outputs
  }
  return 4 * e;
}

double activation_bytes(const ModelConfig& cfg, int64_t batch) {
  const double C = double(cfg.d_model), R = residual_rows(cfg, batch);
  const double outside = R * C + (cfg.arch == Arch::gpt2 ? 2 : 1) * R + R * C;
  return chunk_kept_bytes(cfg, batch, cfg.layers, 0) + rebuilt_bytes(cfg, batch) + 4 * outside;
}

double korthikanti_layer_bytes(double s, double b, double h, double a, double t,
                               bool sequence_parallel) {
  if (sequence_parallel) return s * b * h / t * (34 + 5 * a * s / h);
  return s * b * h * (10 + 24 / t + 5 * a * s / (h * t));
}

}  // namespace tessera
