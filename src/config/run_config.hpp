// The run configuration: the resolved input deck read once into typed sections, one per deck
// section, one field per schema key (core/schema.cpp stays the single list of keys). Every
// consumer takes the section it needs; nothing outside config/ reads a key by name.
//
// Values are the deck's, unchanged: a key that defaults to 0 meaning "auto" (train.
// global_batch, parallel.dp, ...) stays 0 here and is resolved where the facts are known
// (the number of ranks, the dataset). The deck itself is kept for what must show it whole:
// the echo at start, run.json and the checkpoints' metadata.
#pragma once

#include <cstdint>
#include <string>

#include "config/choices.hpp"
#include "core/deck.hpp"

namespace tessera {

struct ModelSection {
  Arch arch = Arch::llama;
  int64_t layers = 0, d_model = 0, heads = 0;
  int64_t kv_heads = 0;    // 0: equal to heads
  int64_t ffn_hidden = 0;  // 0: picked by the architecture
  int64_t vocab = 0, vocab_multiple = 1, seq_len = 0;
  double norm_eps = 0, rope_theta = 0, init_std = 0;
  TieEmbeddings tie_embeddings = TieEmbeddings::automatic;
  // Mixture of experts (doc/moe.md); experts = 0: dense.
  int64_t experts = 0, experts_top_k = 2, shared_experts = 0;
  int64_t expert_ffn = 0;        // 0: ffn_hidden
  std::string moe_layers;        // all, every:K or after:K
  Router router = Router::softmax;
  double aux_loss = 0, router_bias_step = 0, z_loss = 0;
  double capacity_factor = 0;    // 0: dropless
};

struct DataSection {
  std::string path;
  TokenizerKind tokenizer = TokenizerKind::byte;
  double val_fraction = 0;
  bool document_mask = false;  // doc/data.md, "Document masks"
};

struct TrainSection {
  int64_t steps = 0, micro_batch = 0;
  int64_t global_batch = 0;  // 0: micro_batch x dp
  int64_t eval_every = 0, eval_samples = 0;
  int64_t exit_after = 0;  // 0: run to steps
  OnNonfinite on_nonfinite = OnNonfinite::stop;
  int64_t nonfinite_limit = 0;
  double loss_spike = 0;  // 0: no loss-spike rule
  int64_t loss_spike_window = 20;
  int64_t seed = 0;
  TrainPrecision precision = TrainPrecision::fp32;
  // fp16 dynamic loss scaling: the first scale, steps without overflow before it doubles, and
  // the floor below which the run stops.
  double loss_scale = 65536, loss_scale_min = 1;
  int64_t loss_scale_window = 1000;
  Recompute recompute = Recompute::none;
  int64_t recompute_layers = 0;  // with full: the first N blocks of each chunk; 0: all
  int64_t head_chunk_rows = 0;   // output-head rows per chunk; 0: the default
  int64_t head_vocab_tile = 0;   // output-head vocabulary columns per tile; 0: automatic
};

struct OptimSection {
  double lr = 0, min_lr = 0;
  int64_t warmup = 0;
  double beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0, grad_clip = 0;
  bool decay_embeddings = false;
};

struct ParallelSection {
  int tp = 1;
  bool sequence_parallel = false;
  int cp = 1, pp = 1;
  CpKind cp_kind = CpKind::ring;
  PipeSchedule pp_schedule = PipeSchedule::one_f_one_b;
  int pp_virtual = 1;
  bool pp_pair_overlap = true;  // dualpipev's pairs interleaved (doc/pipeline.md)
  std::string pp_layers;  // balanced, even, or a list of layers per model chunk
  int dp = 0;             // 0: ranks / (tp x cp x pp)
  int ep = 1;
  int64_t ep_max_nodes = 0, ep_nodes = 0;  // node-limited routing (doc/moe.md)
  EpDispatch ep_dispatch = EpDispatch::flat;
  std::string order;
  int zero = 0, zero_inflight = 2;
  int64_t shard_group = 0;  // 0: the whole data-parallel group
  double bucket_mb = 0;
  bool overlap = true;
  DpProgress progress = DpProgress::poll;
  ReduceDtype grad_reduce_dtype = ReduceDtype::fp32;
};

struct HardwareSection {
  DeviceKind device = DeviceKind::cpu;
  int ranks_per_node = 0;  // 0: found from shared memory
  int threads = 0;         // 0: OMP_NUM_THREADS or the runtime default
  double peak_flops = 0;   // 0: measured at start
};

struct OutputSection {
  std::string dir;
  int64_t log_every = 1;
  bool echo_deck = true, trace = false;
  int64_t trace_steps = 0;
  bool compare_plan = false;
  double comm_warn_share = 0.3;  // 0: no communication warning
};

struct CheckpointSection {
  int64_t every = 0;
  bool at_end = true;
  std::string dir;  // empty: OUTPUT_DIR/checkpoints
  int64_t keep = 1;
  std::string resume;  // none, latest or a file
  bool overwrite = false;
  bool allow_routing_change = false;  // resume a MoE checkpoint with another top-k or router
};

struct SampleSection {
  std::string prompt;
  int64_t length = 0;
  double temperature = 0;
  int64_t top_k = 0;
  int64_t seed = 0;
  std::string vocab_dir;
  bool print_ids = false;
};

struct RunConfig {
  ModelSection model;
  DataSection data;
  TrainSection train;
  OptimSection optim;
  ParallelSection parallel;
  HardwareSection hardware;
  OutputSection output;
  CheckpointSection checkpoint;
  SampleSection sample;

  static RunConfig from_deck(const Deck& deck);

  const Deck& deck() const { return deck_; }
  const std::string& origin() const { return deck_.origin(); }
  std::string to_ini() const { return deck_.to_ini(); }    // the resolved deck, defaults included
  std::string to_json() const { return deck_.to_json(); }  // for run.json and checkpoints

 private:
  Deck deck_;
};

}  // namespace tessera
