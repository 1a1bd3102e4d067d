// Layout search: every legal layout of a workload on a number of accelerators, costed by
// perf/cost_model.hpp, ranked by predicted throughput; and for every family of layouts
// (one choice of tp, pp, cp, ep) that yields nothing acceptable, why.
//
// A layout is rejected when it is illegal (layout_problem), does not fit in memory (or in a
// smaller budget the user sets, to keep headroom), puts a
// TP group across nodes (unless allowed), or idles in the pipeline bubble more than
// max_bubble of the step, or is predicted above the MFU sanity bound (max_mfu).
#pragma once

#include <string>
#include <vector>

#include "perf/cost_model.hpp"

namespace tessera {

struct SearchSpace {
  // Candidate values per dimension; empty: every value that divides (tp up to a node,
  // unless tp_across_nodes; cp 1 below 16K tokens; ep 1 for dense models).
  std::vector<int> tp, pp, vpp, cp, ep, zero, micro_batch;
  std::vector<Recompute> recompute{Recompute::none, Recompute::selective, Recompute::full};
  std::vector<int> seq_parallel{0, 1};
  std::vector<ComputeType> precision{ComputeType::bf16};
  // Pipeline schedules to try (tessera-plan --schedule): gpipe or one_f_one_b (with every v),
  // and the split-backward kinds (zb_h1 with v = 1, zb_v and dualpipe_v with v = 2).
  std::vector<PipeSchedule> schedules{PipeSchedule::one_f_one_b};
  // Rank orders (parallel.order) to try; empty: tp-cp-ep-dp-pp, and tp-cp-pp-dp-ep for
  // layouts with both a pipeline and data parallelism on more than one node.
  std::vector<std::string> orders;
  // With full recompute: of every layer of a stage (full_all), and of N of them (rc=full:N)
  // for each N in full_layers (below a stage's layers), or when that is empty and
  // partial_recompute is set, for N = 1/4, 1/2 and 3/4 of a stage.
  bool full_all = true;
  std::vector<int> full_layers;
  bool partial_recompute = true;
  bool hsdp = true;              // also try ZeRO shard groups of one node
  bool tp_across_nodes = false;  // accept TP groups that span nodes
  double max_bubble = 0.5;       // reject bubble fractions (p-1)/(v m) above this
  // Reject predictions above this MFU: no published dense run reaches them, so they measure
  // the model's optimism (cost_model.hpp's kMfuSanityBound; doc/planning.md).
  double max_mfu = kMfuSanityBound;
  double memory_budget = 0;  // bytes per accelerator a layout may use; 0: the capacity
};

// Why the layouts of one family (tp, pp, cp, ep) were turned down.
struct FamilyRejection {
  std::string family;  // "tp=16 pp=4 cp=1 ep=1"
  int layouts = 0;     // layouts tried in the family
  int illegal = 0, out_of_memory = 0, tp_across_nodes = 0, bubble = 0;
  int implausible = 0;          // predicted above SearchSpace::max_mfu
  double max_mfu = 0;           // the highest of those predictions
  std::string illegal_reason;   // the first reason a layout was illegal
  double min_excess = 0;        // bytes over capacity of the smallest-memory layout
  Estimate closest;             // that layout (valid when out_of_memory > 0)
  double min_bubble = 0;        // smallest bubble fraction among bubble rejections
  Estimate fastest_rejected;    // fastest layout rejected for TP across nodes/bubble
  std::string summary() const;  // one line: the reasons, with numbers
};

struct SearchResult {
  std::vector<Estimate> accepted;  // best first
  std::vector<FamilyRejection> rejected;
  int considered = 0, legal = 0;
  int implausible = 0;  // layouts rejected for a predicted MFU above SearchSpace::max_mfu
};

SearchResult search(const Workload& w, const Cluster& c, int accelerators, Runtime rt,
                    const SearchSpace& space);

// Divisors of n in increasing order.
std::vector<int> divisors(int n);

}  // namespace tessera
