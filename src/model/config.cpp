#include "model/config.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "config/run_config.hpp"
#include "core/error.hpp"
#include "kernels/kernels.hpp"

namespace tessera {
namespace {

// The [model] keys of a mixture of experts, checked (doc/moe.md).
MoeConfig moe_from(const ModelSection& m, int64_t ffn_hidden) {
  MoeConfig e;
  if (m.experts == 0) {
    TESSERA_REQUIRE(m.shared_experts == 0, "model.shared_experts = ", m.shared_experts,
                    " needs routed experts (model.experts > 0); set shared_experts = 0 for a "
                    "dense model");
    return e;
  }
  e.experts = m.experts;
  e.top_k = m.experts_top_k;
  TESSERA_REQUIRE(e.top_k <= e.experts, "model.experts_top_k = ", e.top_k,
                  " is larger than model.experts = ", e.experts,
                  "; a token cannot take more experts than there are");
  e.shared = m.shared_experts;
  e.ffn = m.expert_ffn == 0 ? ffn_hidden : m.expert_ffn;
  e.router = m.router;
  e.aux_loss = float(m.aux_loss);
  e.bias_step = float(m.router_bias_step);
  e.z_loss = float(m.z_loss);
  e.capacity_factor = float(m.capacity_factor);
  const std::string& s = m.moe_layers;
  auto number_after = [&](size_t at) -> int64_t {
    try {
      size_t used = 0;
      const long long v = std::stoll(s.substr(at), &used);
      if (at + used == s.size()) return v;
    } catch (const std::exception&) {
    }
    return -1;
  };
  if (s == "all") return e;
  if (s.rfind("every:", 0) == 0) e.every = number_after(6);
  else if (s.rfind("after:", 0) == 0) e.after = number_after(6);
  else e.every = -1;
  TESSERA_REQUIRE(e.every >= 1 && e.after >= 0 && e.after < m.layers, "model.moe_layers = '", s,
                  "' is not all, every:K (K >= 1) or after:K (0 <= K < model.layers = ", m.layers,
                  ")");
  TESSERA_REQUIRE(e.every <= m.layers, "model.moe_layers = '", s, "' selects no block of ",
                  m.layers, " (every:K makes blocks K-1, 2K-1, ... mixture-of-experts blocks), so ",
                  "model.experts = ", m.experts,
                  " would train a dense model; use every:K with K <= ", m.layers,
                  ", or model.experts = 0");
  return e;
}

}  // namespace

ModelConfig ModelConfig::from(const ModelSection& m) {
  ModelConfig c;
  c.arch = m.arch;
  c.layers = m.layers;
  c.d_model = m.d_model;
  c.heads = m.heads;
  c.kv_heads = m.kv_heads;
  if (c.kv_heads == 0) c.kv_heads = c.heads;
  c.vocab = m.vocab;
  c.seq_len = m.seq_len;
  c.norm_eps = float(m.norm_eps);
  c.rope_theta = float(m.rope_theta);
  c.init_std = float(m.init_std);

  TESSERA_REQUIRE(c.d_model % c.heads == 0, "model.d_model = ", c.d_model,
                  " is not divisible by model.heads = ", c.heads,
                  "; the head dimension d_model/heads must be an integer");
  c.head_dim = c.d_model / c.heads;
  TESSERA_REQUIRE(c.heads % c.kv_heads == 0, "model.heads = ", c.heads,
                  " is not divisible by model.kv_heads = ", c.kv_heads,
                  "; each key/value head must serve the same number of query heads");
  TESSERA_REQUIRE(c.arch != Arch::gpt2 || c.kv_heads == c.heads,
                  "model.kv_heads = ", c.kv_heads, " differs from model.heads = ", c.heads,
                  " but gpt2 has no grouped-query attention; use model.arch = llama");
  TESSERA_REQUIRE(c.arch != Arch::llama || c.head_dim % 2 == 0, "RoPE needs an even head dimension, ",
                  "but d_model/heads = ", c.head_dim);

  c.ffn_hidden = m.ffn_hidden;
  if (c.ffn_hidden == 0)
    c.ffn_hidden = c.arch == Arch::gpt2 ? 4 * c.d_model : (8 * c.d_model / 3 + 63) / 64 * 64;

  const int64_t mult = m.vocab_multiple;
  c.vocab_padded = (c.vocab + mult - 1) / mult * mult;

  c.tie_embeddings = m.tie_embeddings == TieEmbeddings::automatic
                         ? c.arch == Arch::gpt2
                         : m.tie_embeddings == TieEmbeddings::yes;
  TESSERA_REQUIRE(c.arch != Arch::gpt2 || c.tie_embeddings,
                  "model.tie_embeddings = false is not supported for gpt2, whose output head is "
                  "the token embedding; use auto or true");
  c.moe = moe_from(m, c.ffn_hidden);
  return c;
}

ModelConfig ModelConfig::from(const ModelSection& m, const TrainSection& t, DeviceKind device) {
  ModelConfig c = from(m);
  TESSERA_REQUIRE(t.recompute_layers == 0 || t.recompute == Recompute::full,
                  "train.recompute_layers = ", t.recompute_layers,
                  " needs train.recompute = full (it is ", to_string(t.recompute),
                  "); set recompute = full or recompute_layers = 0");
  TESSERA_REQUIRE(t.recompute_layers <= c.layers, "train.recompute_layers = ", t.recompute_layers,
                  " is more than the model's ", c.layers, " blocks (model.layers); at most ",
                  c.layers, " (0: all)");
  c.recompute = t.recompute;
  c.recompute_layers = t.recompute_layers;
  c.head_chunk_rows = t.head_chunk_rows;
  c.compute = precision_names(t.precision).compute;
  // Vocabulary tiles pay where a 16-bit GEMM is so fast that the logits' traffic sets the head's
  // time: with AMX the tiles' GEMMs run in cache at 2x the rate of the whole-vocabulary ones,
  // and the extra logits GEMM costs less than the traffic saved; on a vector unit (AVX512-BF16,
  // fp32) the GEMMs are compute-bound and the extra GEMM is a loss (doc/performance.md,
  // "Vocabulary tiles"). Not yet measured on a GPU: off there unless asked for.
  c.head_vocab_tile = t.head_vocab_tile > 0 ? t.head_vocab_tile
                      : c.compute != DType::f32 && device == DeviceKind::cpu &&
                              kernels::cpu_matrix_engine()
                          ? kHeadVocabTile
                          : 0;
  return c;
}

namespace {
constexpr PrecisionNames kPrecisions[] = {
    {TrainPrecision::fp32, DType::f32, ComputeType::fp32},
    {TrainPrecision::bf16, DType::bf16, ComputeType::bf16},
    {TrainPrecision::fp16, DType::f16, ComputeType::fp16},
};
}  // namespace

const PrecisionNames& precision_names(TrainPrecision p) {
  for (const PrecisionNames& n : kPrecisions)
    if (n.train == p) return n;
  return kPrecisions[0];
}

const PrecisionNames& precision_names(ComputeType t) {
  for (const PrecisionNames& n : kPrecisions)
    if (n.planner == t) return n;
  TESSERA_REQUIRE(false, "tessera trains in fp32, bf16 or fp16");
  return kPrecisions[0];
}

const PrecisionNames& precision_names(DType compute) {
  for (const PrecisionNames& n : kPrecisions)
    if (n.compute == compute) return n;
  TESSERA_REQUIRE(false, "tessera computes in f32, bf16 or f16, not ", dtype_name(compute));
  return kPrecisions[0];
}

void ModelConfig::split(const TensorParallel& t) {
  const int64_t n = t.size;
  TESSERA_REQUIRE(heads % n == 0, "parallel.tp = ", n, " does not divide model.heads = ", heads,
                  "; tensor parallelism gives each rank whole attention heads");
  TESSERA_REQUIRE(kv_heads % n == 0, "parallel.tp = ", n, " does not divide model.kv_heads = ",
                  kv_heads, "; each rank needs whole key/value heads for its query heads (use "
                  "a tp that divides kv_heads, or more key/value heads)");
  TESSERA_REQUIRE(ffn_hidden % n == 0, "parallel.tp = ", n, " does not divide the MLP width ",
                  ffn_hidden, " (model.ffn_hidden)");
  TESSERA_REQUIRE(vocab_padded % n == 0, "parallel.tp = ", n, " does not divide the padded "
                  "vocabulary ", vocab_padded, "; set model.vocab_multiple to a multiple of ", n);
  tp = t;
}

void ModelConfig::split(const ContextParallel& c) {
  const int64_t n = c.size;
  if (n > 1 && c.kind == CpKind::ring)
    TESSERA_REQUIRE(seq_len % (2 * n) == 0, "parallel.cp = ", n, " with cp_kind = ring cuts ",
                    "each sequence into 2 x cp = ", 2 * n, " zigzag chunks, which does not divide "
                    "model.seq_len = ", seq_len, "; use a seq_len that is a multiple of ", 2 * n);
  if (n > 1 && c.kind == CpKind::ulysses) {
    TESSERA_REQUIRE(seq_len % n == 0, "parallel.cp = ", n, " with cp_kind = ulysses does not "
                    "divide model.seq_len = ", seq_len, "; use a seq_len that is a multiple of ", n);
    TESSERA_REQUIRE(heads_local() % n == 0, "parallel.cp = ", n, " with cp_kind = ulysses gives "
                    "each rank heads / (tp x cp) attention heads, but the ", heads_local(),
                    " heads per tensor-parallel rank (model.heads = ", heads, ", parallel.tp = ",
                    tp.size, ") do not divide by cp; use cp_kind = ring or a cp that divides them");
    TESSERA_REQUIRE(kv_heads_local() % n == 0, "parallel.cp = ", n, " with cp_kind = ulysses ",
                    "gives each rank kv_heads / (tp x cp) key/value heads, but the ",
                    kv_heads_local(), " key/value heads per tensor-parallel rank (model.kv_heads = ",
                    kv_heads, ", parallel.tp = ", tp.size, ") do not divide by cp; use "
                    "cp_kind = ring or a cp that divides them");
  }
  cp = c;
}

void ModelConfig::check_experts(int64_t ep, int64_t tp) const {
  TESSERA_REQUIRE(ep == 1 || moe.enabled(), "parallel.ep = ", ep, " but the model has no ",
                  "experts (model.experts = 0); set parallel.ep = 1 or model.experts > 0");
  if (!moe.enabled()) return;
  TESSERA_REQUIRE(moe.experts % ep == 0, "model.experts = ", moe.experts,
                  " is not divisible by parallel.ep = ", ep,
                  "; every expert-parallel rank holds the same number of routed experts");
  TESSERA_REQUIRE(moe.shared == 0 || (moe.shared * moe.ffn) % tp == 0, "parallel.tp = ", tp,
                  " does not divide the shared experts' width model.shared_experts x expert_ffn",
                  " = ", moe.shared * moe.ffn, " (tensor parallelism splits the shared experts as",
                  " the dense MLP); pick a tp that divides it");
}

void ModelConfig::limit_nodes(int64_t ep_nodes, int placed, int64_t max_nodes) {
  moe.placed_nodes = std::max(placed, 1);
  moe.nodes = moe.placed_nodes, moe.max_nodes = 0;
  if (max_nodes == 0 && ep_nodes == 0) return;
  TESSERA_REQUIRE(moe.enabled(), "parallel.ep_max_nodes = ", max_nodes,
                  " and parallel.ep_nodes = ", ep_nodes,
                  " need routed experts (model.experts = 0); set them to 0");
  TESSERA_REQUIRE(placed > 0, "parallel.ep_max_nodes: the expert-parallel groups do not sit on ",
                  "their nodes in equal blocks of consecutive ep ranks (parallel.order, ",
                  "hardware.ranks_per_node), so experts have no node map; change the order or the ",
                  "ranks per node");
  TESSERA_REQUIRE(ep_nodes == 0 || placed == 1 || ep_nodes == placed,
                  "parallel.ep_nodes = ", ep_nodes, " but the expert-parallel group spans ", placed,
                  " nodes; set ", "parallel.ep_nodes = ", placed, " or 0");
  const int64_t G = ep_nodes > 0 ? ep_nodes : placed;
  TESSERA_REQUIRE(moe.experts % G == 0, "model.experts = ", moe.experts, " does not divide over ",
                  "the ", G, " nodes of node-limited routing (parallel.ep_nodes)");
  TESSERA_REQUIRE(max_nodes <= G, "parallel.ep_max_nodes = ", max_nodes, " is larger than the ", G,
                  " nodes the expert-parallel group spans (parallel.ep_nodes, ",
                  "hardware.ranks_per_node); use at most ", G, ", or 0 for unrestricted routing");
  TESSERA_REQUIRE(max_nodes == 0 || max_nodes * (moe.experts / G) >= moe.top_k,
                  "parallel.ep_max_nodes = ", max_nodes, " nodes hold ", max_nodes, " x ",
                  moe.experts / G, " = ", max_nodes * (moe.experts / G), " experts, fewer than ",
                  "model.experts_top_k = ", moe.top_k, "; raise ep_max_nodes");
  moe.nodes = G, moe.max_nodes = max_nodes;
}

void ModelConfig::dispatch_two_level(int ep, int placed) {
  moe.two_level = false;
  TESSERA_REQUIRE(moe.enabled() && ep > 1, "parallel.ep_dispatch = two_level needs expert ",
                  "parallelism (model.experts > 0 and parallel.ep > 1; here experts = ",
                  moe.experts, ", ep = ", ep, "); set parallel.ep_dispatch = flat");
  TESSERA_REQUIRE(
      placed > 0, "parallel.ep_dispatch = two_level: the expert-parallel groups do ",
      "not sit on their nodes in equal blocks of consecutive ep ranks (parallel.order, ",
      "hardware.ranks_per_node); change the order or the ranks per node, or set ",
      "parallel.ep_dispatch = flat");
  TESSERA_REQUIRE(cp.size == 1, "parallel.ep_dispatch = two_level with parallel.cp = ", cp.size,
                  " is not available yet (a context-parallel rank dispatches pieces of ",
                  "sequences, which the two-level dispatch's tables do not follow); set ",
                  "parallel.ep_dispatch = flat or parallel.cp = 1");
  TESSERA_REQUIRE(moe.nodes > 1, "parallel.ep_dispatch = two_level but the expert-parallel group ",
                  "spans one node: there is nothing to send once per node; spread it over nodes ",
                  "(hardware.ranks_per_node, or parallel.ep_nodes to route as on several) or set ",
                  "parallel.ep_dispatch = flat");
  TESSERA_REQUIRE(ep % moe.nodes == 0, "parallel.ep_dispatch = two_level: parallel.ep = ", ep,
                  " does not divide over the ", moe.nodes, " nodes (parallel.ep_nodes); each node ",
                  "must hold the same number of ep ranks");
  moe.two_level = true;
}

int64_t ModelConfig::param_count() const {
  const int64_t C = d_model, F = ffn_hidden, qd = heads * head_dim, kvd = kv_heads * head_dim;
  const bool b = has_bias();
  int64_t per_layer = C * qd + 2 * C * kvd + qd * C;                 // q, k, v, o
  per_layer += (arch == Arch::llama ? 3 : 2) * C * F;                // MLP
  per_layer += 2 * C * (b ? 2 : 1);                                  // two norms
  if (b) per_layer += qd + 2 * kvd + C + F + C;                      // biases
  int64_t n = layers * per_layer + vocab_padded * C + C * (b ? 2 : 1);
  if (arch == Arch::gpt2) n += seq_len * C;
  if (!tie_embeddings) n += vocab_padded * C;
  if (!moe.enabled()) return n;
  // A mixture-of-experts block trades its MLP for a router and its experts.
  const int64_t mlp = (arch == Arch::llama ? 3 : 2) * C * F + (b ? F + C : 0);
  n += moe_blocks() * ((moe.experts + moe.shared) * expert_param_count() + moe.experts * C +
                       moe.experts - mlp);
  return n;
}

int64_t ModelConfig::expert_param_count() const {
  const int64_t C = d_model, F = moe.ffn;
  return (arch == Arch::llama ? 3 : 2) * C * F + (has_bias() ? F + C : 0);
}

int64_t ModelConfig::moe_blocks() const {
  int64_t n = 0;
  for (int64_t l = 0; l < layers; ++l) n += moe.is_moe(l);
  return n;
}

int64_t ModelConfig::active_param_count() const {
  return param_count() - moe_blocks() * (moe.experts - moe.top_k) * expert_param_count();
}

}  // namespace tessera
