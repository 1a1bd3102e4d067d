// One parallel layout as the planner costs it, and the workload it runs: the model shape
// (ModelConfig, from the same [model] section a training deck has), the global batch, and the
// few facts about the kernels that change memory and time (flash attention, dropout, MoE).
//
// Text form (what --explain takes and reports print), comma- or space-separated key=value:
//   dp=2 tp=8 pp=4 v=1 cp=1 ep=1 zero=1 hsdp=0 mb=1 sp=1 rc=selective prec=bf16 sched=1f1b
//   order=tp-cp-pp-dp-ep
// Omitted keys keep their defaults (all degrees 1, zero 0, mb 1, no SP, no recompute, bf16,
// 1F1B, rank order tp-cp-ep-dp-pp); dp may be omitted when the accelerator count is known (it
// is what is left). rc=full:N recomputes N layers of each stage (the others keep their
// activations); order= is parallel.order, fastest axis first, printed only when it is not the
// default.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "config/choices.hpp"
#include "model/config.hpp"
#include "perf/cluster.hpp"

namespace tessera {

const char* recompute_name(Recompute r);

struct Layout {
  int dp = 1, tp = 1, pp = 1, vpp = 1, cp = 1, ep = 1;
  int zero = 0;
  int shard_group = 0;  // HSDP: ranks sharing one copy of the sharded state; 0: all of dp x cp
  int micro_batch = 1;  // sequences per micro-batch per model replica
  bool seq_parallel = false;
  Recompute recompute = Recompute::none;
  int recompute_layers = 0;  // rc=full: layers of each stage recomputed; 0: all of them
  ComputeType precision = ComputeType::bf16;
  // gpipe, one_f_one_b, or a split-backward kind (zb_h1, zb_v, dualpipe_v): a Layout spells
  // interleaved 1F1B as one_f_one_b with vpp > 1 (run_schedule() gives the runtime's kind).
  PipeSchedule schedule = PipeSchedule::one_f_one_b;
  // Rank order (parallel.order, fastest axis first): which ranks form each group, so which
  // links each group's traffic crosses (perf/placement.hpp).
  std::string order = kDefaultRankOrder;
  static constexpr const char* kDefaultRankOrder = "tp-cp-ep-dp-pp";
  // Bytes per element the data-parallel / ZeRO collectives move: gradients (grad=bf16|fp32,
  // tessera's parallel.grad_reduce_dtype) and gathered weights; 0: by precision (2 when
  // mixed, 4 in fp32), as a Megatron-style runtime keeps them.
  int grad_bytes = 0, weight_bytes = 0;

  int accelerators() const { return dp * tp * pp * cp; }
  // The schedule tessera runs for this layout (interleaved for one_f_one_b with vpp > 1).
  PipeSchedule run_schedule() const {
    return schedule == PipeSchedule::one_f_one_b && vpp > 1 ? PipeSchedule::interleaved : schedule;
  }
  // Ranks over which ZeRO shards the model state (ZeRO shards over dp x cp, as Megatron's
  // distributed optimizer does).
  int shard_ranks() const { return zero == 0 ? 1 : shard_group > 0 ? shard_group : dp * cp; }
  bool mixed() const { return precision != ComputeType::fp32; }
  double grad_elem_bytes() const { return grad_bytes ? grad_bytes : mixed() ? 2 : 4; }
  double weight_elem_bytes() const { return weight_bytes ? weight_bytes : mixed() ? 2 : 4; }
  // Layers of a stage of `stage_layers` that full recompute rebuilds (0 without it).
  double recomputed_layers(double stage_layers) const {
    if (recompute != Recompute::full) return 0;
    return recompute_layers > 0 ? std::min<double>(recompute_layers, stage_layers) : stage_layers;
  }
  bool operator==(const Layout&) const = default;
};

std::string to_string(const Layout& l);
// Parses the text form over `base`; dp = 0 in the result means "not given".
Layout parse_layout(const std::string& text, Layout base = Layout{});

// Mixture-of-experts shape (not yet in the deck; planner options --experts/--top-k/...).
struct MoeShape {
  int experts = 0;         // routed experts per MoE layer; 0: a dense model
  int top_k = 1;           // experts each token is sent to
  int64_t expert_ffn = 0;  // hidden size of one expert's MLP; 0: model.ffn_hidden
  bool any() const { return experts > 0; }
};

struct Workload {
  ModelConfig cfg;
  MoeShape moe;
  int64_t global_batch = 1;     // sequences per optimizer step
  bool flash_attention = true;  // attention scores never stored (FlashAttention)
  // Causal (decoder) attention: a FlashAttention kernel skips the tiles above the diagonal,
  // about half the T x T work; materialised scores are computed in full and then masked.
  bool causal = true;
  bool dropout = false;                // dropout layers (and their masks) as in GPT-3/Megatron
  int zero_inflight = 2;               // runtime tessera: parallel.zero_inflight
  std::string pp_layers = "balanced";  // runtime tessera: parallel.pp_layers
  CpKind cp_kind = CpKind::ring;       // runtime tessera: parallel.cp_kind
  // Runtime tessera, a deck's mixture of experts: parallel.ep_dispatch, parallel.ep_nodes (0:
  // the nodes the ep group spans on the cluster) and parallel.ep_max_nodes.
  EpDispatch ep_dispatch = EpDispatch::flat;
  int64_t ep_nodes = 0, ep_max_nodes = 0;
  bool document_mask = false;  // runtime tessera: data.document_mask
  // Runtime tessera: parallel.pp_pair_overlap and hardware.device, which decide with the
  // layout whether dualpipev's pairs interleave (parallel/pp/paired_overlap.hpp).
  bool pp_pair_overlap = true;
  DeviceKind device = DeviceKind::cpu;
};

// Sequences per model replica per step and micro-batches per step for a layout; 0 when the
// global batch does not split evenly.
int64_t microbatches(const Workload& w, const Layout& l);

}  // namespace tessera
