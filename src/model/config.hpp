// The model's shape, resolved from the deck's [model] section and checked for consistency.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/choices.hpp"  // Arch, Recompute
#include "tensor/tensor.hpp"    // DType

namespace tessera {

struct ModelSection;
struct TrainSection;

// How this rank's layers are split by tensor parallelism (Megatron-LM): `size` ranks share
// every block's matrices, this one is number `rank`; sequence_parallel also shards the
// residual stream's tokens (norms, residual adds, dropout-free) over them.
struct TensorParallel {
  int64_t size = 1, rank = 0;
  bool sequence_parallel = false;
};

// How each sequence is split by context parallelism: `size` ranks share every sequence, this
// one is number `rank`. ring: the sequence is cut into 2 x size chunks and this rank holds
// chunks rank and 2 x size - 1 - rank (zigzag, so every rank does the same causal work);
// ulysses: it holds chunk rank of size. A rank's tokens of a micro-batch are laid out
// segment by segment ([segment][sequence][token of the segment]), so each segment is a dense
// [B, len] block with contiguous global positions.
struct ContextParallel {
  int64_t size = 1, rank = 0;
  CpKind kind = CpKind::ring;
  struct Segment {
    int64_t pos0, len;  // global position of the first token, tokens
  };
  // This rank's segments of a sequence of seq_len tokens (one segment without cp).
  std::vector<Segment> segments(int64_t seq_len) const {
    if (size == 1) return {{0, seq_len}};
    if (kind == CpKind::ulysses) return {{rank * (seq_len / size), seq_len / size}};
    const int64_t c = seq_len / (2 * size);
    return {{rank * c, c}, {(2 * size - 1 - rank) * c, c}};
  }
};

// Mixture of experts (doc/moe.md): which blocks replace their MLP by a router, `experts`
// routed experts of which each token takes top_k, and `shared` experts every token takes.
struct MoeConfig {
  int64_t experts = 0, top_k = 0, shared = 0, ffn = 0;  // experts = 0: dense
  Router router = Router::softmax;
  float aux_loss = 0, bias_step = 0, z_loss = 0, capacity_factor = 0;
  int64_t every = 1, after = 0;  // moe_layers: every:K, after:K (all = every:1)
  // Node-limited routing (parallel.ep_max_nodes, doc/moe.md): node g holds experts
  // [g E/nodes, (g+1) E/nodes); each token chooses among at most max_nodes of them (0 or
  // max_nodes >= nodes: unrestricted). placed_nodes: the nodes the ep group really spans (ep
  // rank d on node d x placed_nodes / ep), for counting the cross-node dispatch bytes.
  int64_t nodes = 1, max_nodes = 0, placed_nodes = 1;
  // parallel.ep_dispatch = two_level (doc/moe.md, "Two-level dispatch"): tokens cross to each
  // of the `nodes` nodes once, the ep group being `nodes` blocks of ep / nodes ranks.
  bool two_level = false;
  bool node_limited() const { return max_nodes > 0 && max_nodes < nodes; }
  bool enabled() const { return experts > 0; }
  // Whether block `layer` (global index) is a mixture-of-experts block.
  bool is_moe(int64_t layer) const {
    return enabled() && layer >= after && (layer - after) % every == every - 1;
  }
};

// Which routed experts this rank holds (doc/moe.md, "Expert parallelism"): with size > 1 the
// experts are split over `size` expert-parallel ranks and this one registers only experts
// [rank E/size, (rank+1) E/size) (their parameters, gradients and optimizer state); size 1:
// every expert (a serial model, or expert parallelism under ZeRO, which still shards every
// expert over the data-parallel group).
struct ExpertShard {
  int64_t size = 1, rank = 0;
};

// train.precision in each vocabulary that speaks of it, in one table: the deck's choice, the
// dtype of the GEMM operands and of the parameters' compute copy (kernels, ParamStore), and
// the planner's precision (perf/: Layout::precision, a cluster's peak).
struct PrecisionNames {
  TrainPrecision train;
  DType compute;
  ComputeType planner;
};
const PrecisionNames& precision_names(TrainPrecision p);
// The precision tessera trains for a planner's precision (a tessera::Error for fp8), and for
// a compute dtype.
const PrecisionNames& precision_names(ComputeType t);
const PrecisionNames& precision_names(DType compute);

struct ModelConfig {
  Arch arch = Arch::llama;
  int64_t layers = 0, d_model = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn_hidden = 0;
  int64_t vocab = 0, vocab_padded = 0, seq_len = 0;
  float norm_eps = 1e-5f, rope_theta = 10000.0f, init_std = 0.02f;
  bool tie_embeddings = false;
  TensorParallel tp;
  ContextParallel cp;
  MoeConfig moe;
  ExpertShard experts_held;
  // Activation recompute (train.recompute, doc/recompute.md): with full, the first
  // recompute_layers blocks of each model chunk (0: all) keep only their input.
  Recompute recompute = Recompute::none;
  int64_t recompute_layers = 0;
  // The output head's rows per chunk (train.head_chunk_rows; 0: kHeadChunkRows): the logits
  // of at most this many rows exist at once (model/output_head.cpp).
  static constexpr int64_t kHeadChunkRows = 512;
  int64_t head_chunk_rows = 0;
  // Rows of one head chunk for a micro-batch of N rows.
  int64_t head_rows(int64_t N) const {
    const int64_t c = head_chunk_rows > 0 ? head_chunk_rows : kHeadChunkRows;
    return c < N ? c : N;
  }

  // The output head's vocabulary columns per tile (train.head_vocab_tile, its 0 resolved by
  // from(): kHeadVocabTile with 16-bit GEMMs on a CPU matrix engine, else 0); 0, or a tile at
  // least the rank's vocabulary: the whole vocabulary at once (model/output_head.cpp).
  static constexpr int64_t kHeadVocabTile = 1024;
  int64_t head_vocab_tile = 0;
  // Columns of one head tile, or 0 when the head does not tile this rank's vocabulary.
  int64_t head_tile_cols() const {
    return head_vocab_tile > 0 && head_vocab_tile < vocab_local() ? head_vocab_tile : 0;
  }

  // The GEMMs' operand dtype (train.precision: f32, bf16 or f16). A 16-bit run keeps the
  // activations that only feed GEMMs (the norms' outputs before attention and a dense MLP, the
  // MLP's activation) in it alone (doc/precision.md, "What is 16-bit").
  DType compute = DType::f32;
  // Bytes of one element of such an activation.
  double operand_bytes() const { return compute == DType::f32 ? 4 : 2; }

  static ModelConfig from(const ModelSection& m);
  // The model and how its blocks treat their activations (train.recompute*).
  // device: where the GEMMs run (train.head_vocab_tile's automatic choice).
  static ModelConfig from(const ModelSection& m, const TrainSection& t,
                          DeviceKind device = DeviceKind::cpu);
  // How block `index` of its model chunk (0 = the chunk's first) treats its activations:
  // Megatron-LM's block method fully recomputes the first recompute_layers blocks of each
  // chunk (under 1F1B a stage's first blocks hold their activations longest) and keeps the
  // others'.
  Recompute block_recompute(int64_t index) const {
    if (recompute != Recompute::full) return recompute;
    return recompute_layers == 0 || index < recompute_layers ? Recompute::full : Recompute::none;
  }
  // Splits the model over tp ranks; a collective error names the dimension that does not
  // divide (heads, key/value heads, MLP width, padded vocabulary).
  void split(const TensorParallel& t);
  // Splits each sequence over cp ranks; a collective error names what does not divide.
  void split(const ContextParallel& c);
  // Checks the routed experts split over ep expert-parallel ranks and the shared experts' width
  // over tp (doc/moe.md); a collective error otherwise.
  void check_experts(int64_t ep, int64_t tp) const;
  // Node-limited routing (doc/moe.md): the nodes the experts are spread over, parallel.ep_nodes
  // or else `placed` (ProcessGrid::blocked_nodes of the ep group, 0: not in equal blocks), and
  // at most max_nodes of them per token; checked, then kept in moe.
  void limit_nodes(int64_t ep_nodes, int placed, int64_t max_nodes);
  // parallel.ep_dispatch = two_level at expert-parallel degree ep, after limit_nodes: checked
  // (several nodes, ep a multiple of them, the ep group in blocks), then kept in moe.
  void dispatch_two_level(int ep, int placed);
  // Tokens of one sequence this rank holds (seq_len without context parallelism).
  int64_t seq_local() const { return seq_len / cp.size; }
  // Global position of row n of a micro-batch of B sequences as this rank lays them out.
  int64_t position_of(int64_t n, int64_t B) const {
    for (const ContextParallel::Segment& s : cp.segments(seq_len)) {
      if (n < B * s.len) return s.pos0 + n % s.len;
      n -= B * s.len;
    }
    return -1;
  }
  int64_t heads_local() const { return heads / tp.size; }
  int64_t kv_heads_local() const { return kv_heads / tp.size; }
  int64_t ffn_local() const { return ffn_hidden / tp.size; }
  int64_t vocab_local() const { return vocab_padded / tp.size; }
  const char* arch_name() const { return to_string(arch); }
  bool has_bias() const { return arch == Arch::gpt2; }
  int64_t param_count() const;  // including padding rows
  // Parameters a token uses: param_count less the routed experts it does not take.
  int64_t active_param_count() const;
  // Parameters of one expert (routed or shared), and the mixture-of-experts blocks.
  int64_t expert_param_count() const;
  int64_t moe_blocks() const;
};

}  // namespace tessera
