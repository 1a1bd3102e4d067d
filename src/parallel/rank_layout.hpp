// What a layout means for one rank: its share of the model under tensor and context
// parallelism, the routed experts it holds, the batch geometry, the pipeline schedule and its
// cut, its ZeRO shard groups, the parameter elements it holds, its model-state bytes, the
// compute dtype and the loss scaling. A pure function of the configuration, the grid and the
// rank (no MPI), so the trainer, tessera's checks before allocation, the run's report, the plan
// comparison and `tessera-plan --runtime tessera` read one answer instead of deriving it
// again, and every layout check runs here, once, with one error text each
// (doc/architecture.md, "What a layout means for a rank").
#pragma once

#include <cstdint>
#include <vector>

#include "comm/grid_layout.hpp"
#include "config/run_config.hpp"
#include "model/config.hpp"
#include "model/parts.hpp"
#include "parallel/pp/schedule.hpp"

namespace tessera {

struct BatchGeometry {
  int64_t micro_batch = 0;   // sequences per micro-batch per rank
  int64_t global_batch = 0;  // sequences per step over all ranks
  int64_t accum = 0;         // micro-batches per step per rank
  int64_t dp = 1;
  // global_batch 0: one micro-batch per data-parallel rank.
  static BatchGeometry from(int64_t micro_batch, int64_t global_batch, int64_t dp);
};

// ZeRO's N: the data- and context-parallel ranks sharing one copy of the model state
// (parallel.shard_group, 0 meaning all dp_cp of them). N_e: the ranks one routed expert's state
// is sharded over, the shard group's share of the expert-data-parallel ranks (N / ep; 1 when
// the shard group lies within an expert-parallel group; doc/moe.md, "Expert memory").
int64_t shard_ranks_of(int64_t shard_group, int64_t dp_cp);
int64_t expert_shard_ranks_of(int64_t shard_ranks, int64_t ep);

// Model-state bytes (params, gradients, optimizer) of psi parameters sharded over n ranks at a
// ZeRO stage: tessera's fp32 formulas, or (mixed) the ZeRO paper's mixed-precision ones that
// a Megatron-style runtime follows (perf/memory.hpp writes both out).
struct ModelStateBytes {
  double params = 0, grads = 0, optimizer = 0;
  double total() const { return params + grads + optimizer; }
};
ModelStateBytes zero_model_state(int stage, double psi, double n, bool mixed);

// Elements of tessera's parameter buffer per section, as ParamStore lays them out
// (DataParallel::store_layout): every tensor 16-aligned; under ZeRO each part padded to a
// multiple of 16 N, a held-expert section to 16 N_e. c.tp gives the tensor-parallel split,
// c.experts_held.size the expert-parallel degree.
struct ParamSections {
  double embed = 0, block = 0, head = 0, total = 0;
  double moe_dense = 0, moe_experts = 0;  // one MoE block's sections
  double experts = 0;                     // every expert section: total - experts is dense
  double expert_shard_ranks = 1;          // N_e
  // Part q's elements (0 embedding, 1..L blocks, L + 1 head) and, sharded over K ranks, a
  // rank's piece of it (dense section / K + expert section / N_e).
  double part(const ModelConfig& c, int q) const;
  double piece(const ModelConfig& c, int q, double K) const;
};
ParamSections param_sections(const ModelConfig& c, int zero, int64_t shard_ranks);

// fp16's dynamic loss scaling (train.precision = fp16; static for the other precisions).
struct LossScaling {
  bool dynamic = false;
  double scale = 1, floor = 1;
  int64_t window = 1000;
};

struct RankLayout {
  GridDegrees degrees;
  GridLayout::Coord coord;
  // This rank's model: split over tp (with sequence parallelism) and cp, its routed experts
  // (experts_held), node-limited routing, recompute and the compute dtype (model.compute).
  ModelConfig model;
  BatchGeometry batch;
  // The schedule every step runs: with one stage, one forward then one backward per
  // micro-batch (1f1b with p = 1), the serial loop.
  pp::ScheduleShape schedule;
  std::vector<int64_t> chunk_layers;  // blocks per model chunk (empty with one stage)
  std::vector<ChunkLayers> chunks;    // this stage's model chunks
  int zero = 0;
  int64_t dp_cp = 1;               // ranks summing the dense gradients (dp x cp)
  int64_t shard_ranks = 1;         // N (1 without ZeRO)
  int64_t expert_shard_ranks = 1;  // N_e (1 without ZeRO)
  ParamSections sections;
  // Elements of part q this rank holds (0 where another stage holds it; at 0 on the last
  // stage, the copy of a tied token table), their sum, and the held experts' share of it.
  std::vector<double> part_elements;
  double params = 0, expert_params = 0;
  LossScaling loss_scaling;

  // Every check of the layout, as a tessera::Error naming the deck keys. ep_placed_nodes: the
  // nodes the rank's ep group spans in equal blocks (ProcessGrid::blocked_nodes; 0: not in
  // equal blocks, 1 on one node).
  static RankLayout make(const RunConfig& run, const GridLayout& grid, int rank,
                         int ep_placed_nodes);
  // The same from a whole model (ModelConfig::from, not yet split) and the parallel keys,
  // for a layout that is planned rather than run.
  static RankLayout make(const ModelConfig& whole, const ParallelSection& parallel,
                         int64_t micro_batch, int64_t global_batch, const GridLayout& grid,
                         int rank, int ep_placed_nodes);

  int stages() const { return schedule.stages; }
  // tessera's model state on this rank: the fp32 formulas over the dense sections (N) and
  // the held experts (N_e), plus in a 16-bit run the compute copy, 2 psi below ZeRO-3 and the
  // copy of its shard, 2 psi / N, at ZeRO-3 (charged to params; doc/precision.md). The check
  // before allocation, the summary and the planner all take this.
  ModelStateBytes model_state() const;
  double compute_copy_bytes() const;
};

}  // namespace tessera
