// The planner's cost model: memory per accelerator by category and step time by component
// for one layout of one workload on one cluster. Each term is a named function in perf/
// (compute_model, activation_memory, comm_model, memory); this file adds them up.
//
// Step time (per optimizer step; m micro-batches per model replica, p stages, v chunks):
//   compute    m x (L/p x (forward + backward of a layer) + the head on the last stage)
//   recompute  m x L/p x (the forward work recompute repeats)
//   tp, cp, ep m x L/p x (the dimension's traffic per layer; CP only what exceeds the
//              attention it overlaps)
//   p2p        m x (the stage's send/recv per micro-batch)
//   bubble     (p-1)/v x (one micro-batch's time on the slowest stage) (Narayanan et al.
//              2021: bubble fraction (p-1)/(v m); seed 000's (p-1)/m for v = 1)
//   dp         DP/ZeRO traffic less the part hidden behind backward (comm_model.hpp)
//   optimizer  28 bytes moved per locally updated parameter at memory bandwidth (AdamW: read
//              gradient, read and write weight, m and v)
// Throughput: tokens/s = B s / step; model FLOPs per step = workload_flops_per_token x B s;
// hardware FLOPs add the recomputed forward work; MFU and HFU divide by accelerators x peak x
// step (seed 001's MFU definition); "TFLOP/s per accelerator" is hardware FLOPs / step /
// accelerators, as Megatron-LM reports it.
//
// Memory per accelerator, for the first and the last pipeline stage, the larger reported:
//   params, grads, optimizer   perf/memory.hpp's ZeRO formulas on the stage's parameters
//                              per TP rank (Psi_r), N = ranks per shard group
//   activations                activation_memory.hpp: saved bytes per layer x layers in flight
//                              (+ embedding output on the first stage, logits in fp32 on the
//                              last; + one layer rebuilt at a time under full recompute)
//   comm                       send/recv buffers (PP, CP, EP), ZeRO-3's gathered layers
//                              (current and prefetched), ZeRO-2/3's gradient staging (two
//                              layers)
//   workspace                  backward temporaries: two gradients of the widest activation
//   reserved                   the cluster's reserved_gb (runtime context, fragmentation)
//
// Runtime tessera (the code in this repository, as it runs today: fp32, DP, ZeRO and TP/SP)
// uses tessera's own layer buffers instead (activation_bytes, tessera_workspace_bytes,
// param_sections and RankLayout), which the plan_validate_tessera test compares with the
// allocator's high-water marks.
#pragma once

#include <string>
#include <vector>

#include "perf/cluster.hpp"
#include "perf/comm_model.hpp"
#include "perf/layout.hpp"
#include "perf/memory.hpp"
#include "perf/overlap.hpp"

namespace tessera {

enum class Runtime { megatron, tessera };

// No published dense training run on A100 or H100 reaches more than about 55% MFU
// (Korthikanti et al. 2022: 54.2% for 530B; Llama 3 on H100: 38-43%; doc/planning.md). A
// prediction above this bound (5 points of margin) is flagged, the search sets it aside, and
// the calibration test keeps the search's first choices under it.
inline constexpr double kMfuSanityBound = 0.60;
const char* runtime_name(Runtime r);
Runtime parse_runtime(const std::string& s);

// Transformer layers on the first, the last and the fullest pipeline stage: L / p when
// p x v divides L (the even cut), otherwise the cut tessera's runtime makes
// (parallel.pp_layers, balanced by default: pp/stage_layers.hpp), in every runtime.
struct StageLayers {
  double first = 0, last = 0, most = 0;
  double end = 0;  // stage p-1 (a V placement puts the loss on stage 0, so not `last`)
};

struct TimeBreakdown {
  double compute = 0, recompute = 0;
  double tp_comm = 0, cp_comm = 0, ep_comm = 0;
  double pp_p2p = 0, pp_bubble = 0;
  double dp_comm = 0, dp_hidden = 0;  // DP/ZeRO traffic, and the part of it hidden by overlap
                                      // (perf/overlap.hpp, layer by layer)
  // The part of ep_comm hidden by dualpipev's interleaved pairs (runtime tessera when it
  // interleaves them, runtime megatron always): each pair's all-to-alls behind the other
  // pass's compute, up to that compute's time.
  double ep_hidden = 0;
  double optimizer = 0;
  // Of compute: forward and backward (for comparison with a run's phase timers).
  double forward = 0, backward = 0;
  double total() const {
    return compute + recompute + tp_comm + cp_comm + ep_comm - ep_hidden + pp_p2p + pp_bubble +
           dp_comm - dp_hidden + optimizer;
  }
};

struct Estimate {
  Layout layout;
  Runtime runtime = Runtime::megatron;
  int64_t microbatches = 0;
  MemoryBreakdown memory;  // the fuller of the first and last stage
  double capacity = 0;     // bytes per accelerator
  TimeBreakdown time;
  double step_seconds = 0, tokens_per_second = 0;
  double model_flops_per_step = 0, hardware_flops_per_step = 0;
  double model_tflops = 0, hardware_tflops = 0;  // per accelerator
  double mfu = 0, hfu = 0;
  double bubble_fraction = 0;  // (p-1)/(v m)
  double ep_pairs = 0;         // dualpipev's interleaved pairs per step (the fewest of a stage)
  double params_per_rank = 0;  // Psi_r of the stage reported
  GroupLinks links;
  DpOverlap dp_overlap;  // the DP/ZeRO traffic term by term, exposed and hidden
  StageLayers stage_layers;
  double mfu_causal = 0;  // MFU counting only the causal half of attention's T x T
  // MoE (ep > 1): the bytes of the token all-to-alls a rank sends per step, its own rows
  // included (dispatch and combine, forward and backward), assuming balanced loads; (ep - 1)
  // / ep of them leave the rank.
  double ep_bytes_per_step = 0;           // the stage with the most MoE blocks
  std::vector<double> ep_bytes_by_stage;  // pipeline stage by stage
  // parallel.ep_dispatch = two_level: of those, inside the node and across nodes (by stage).
  std::vector<double> ep_intra_bytes_by_stage, ep_cross_bytes_by_stage;
  std::vector<std::string> warnings;
  bool fits() const { return memory.total() <= capacity; }
};

// Why the layout cannot run this workload on this cluster (divisibility, heads, layers,
// batch, machine size, what the runtime implements); empty when it can.
std::string layout_problem(const Workload& w, const Layout& l, const Cluster& c, Runtime rt,
                           int accelerators);
// The estimate (call only for a layout without a problem). `links` and `cut`:
// group_links(l, c) and stage_layer_counts(w, l) when the caller has them already (the
// search shares them between layouts of one grid and one pipeline shape).
Estimate estimate(const Workload& w, const Layout& l, const Cluster& c, Runtime rt,
                  const GroupLinks* links = nullptr, const StageLayers* cut = nullptr);

StageLayers stage_layer_counts(const Workload& w, const Layout& l);

// Parameters per TP rank of the first and the last pipeline stage (the one with the loss;
// with a V placement, zb-v and dualpipev, that is stage 0, which holds the embedding and the
// head: first = last), and of stage p-1 (`end`; = last without a V).
struct StageParams {
  double first = 0, last = 0, end = 0;
  double experts = 0;      // of first and last: MoE expert weights, whose ZeRO shards span dp x
                           // cp / ep
  double end_experts = 0;  // of end
};
StageParams stage_params(const Workload& w, const Layout& l);
StageParams stage_params(const Workload& w, const Layout& l, const StageLayers& cut);

}  // namespace tessera
