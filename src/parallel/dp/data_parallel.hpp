// Data parallelism as the step loop sees it, whatever the strategy: plain replication with
// bucketed all-reduce overlapped with backward (GradBuckets), ZeRO-1/2/3, and HSDP on top of
// ZeRO. The trainer and the reporting code talk to this interface only; which strategy runs
// is decided once, by make_data_parallel().
//
// A step, as the trainer drives it:
//   begin_step()                       before the first micro-batch
//   begin/end(part, pass, training)    around every part's pass (PartHooks; the model calls)
//   before_backward(ctx, last)         before each micro-batch's backward pass
//   reduce_gradients(whole_final)      after the last backward: this rank's summed gradients
//   optimizer on values() / segments()
//   after_optimizer()                  every rank gets the parameters it needs next
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "config/run_config.hpp"
#include "model/param.hpp"
#include "model/step_context.hpp"
#include "model/transformer.hpp"
#include "optim/adamw.hpp"
#include "parallel/dp/grad_buckets.hpp"

namespace tessera {

// Where this rank keeps an array laid out like the store's flat buffers: `data` indexed by
// the segments' local offsets, the same data held by the ranks of `replicas` (they split
// writing it to a checkpoint).
struct Holding {
  float* data = nullptr;
  const std::vector<ShardSegment>* segments = nullptr;
  const Communicator* replicas = nullptr;
  // The ranks holding the same routed experts (Param::expert) where this rank holds only its
  // expert-parallel group's: the expert-data-parallel group; null when no parameter is one.
  const Communicator* expert_replicas = nullptr;
};

class DataParallel : public PartHooks {
 public:
  // The store layout the strategy needs (before ParamStore::finalize). Errors (collective,
  // before any work) when the options do not fit the data-parallel degree.
  // ep: the expert-parallel degree (held experts are sharded over dp / ep ranks).
  static StoreLayout store_layout(const ParallelSection& o, const Transformer& model, int64_t dp,
                                  int64_t ep = 1);

  // Parameter values from (seed, name, global element index), wherever they are held.
  virtual void initialize(uint64_t seed) = 0;
  // A part whose gradients must stay whole until reduce_gradients runs whole_final (the tied
  // token table of a pipeline: its two copies are summed over the embedding group first).
  virtual void defer(int part) = 0;
  virtual void begin_step() = 0;
  virtual void before_backward(StepContext& ctx, bool last_micro_batch) = 0;
  // After the last backward. whole_final runs when the deferred parts' gradients are whole
  // and final. Returns this rank's summed gradients, indexed as segments() says.
  virtual const float* reduce_gradients(const std::function<void()>& whole_final) = 0;
  // The elements this rank updates, in the flat buffers, and where they sit locally.
  virtual const std::vector<ShardSegment>& segments() const = 0;
  // Sums a per-rank quantity of the optimizer's elements over the ranks that split them.
  virtual void sum_over_shards(double* x, int n) = 0;
  // The same for the held experts' elements (Param::expert), which are split over the expert
  // shard group (the trainer then sums them over the ep group).
  virtual void sum_experts_over_shards(double* x, int n) = 0;
  // The parameter values the optimizer updates and how they are indexed.
  virtual float* optimizer_values() = 0;
  virtual AdamW::Index optimizer_index() const = 0;
  // Whether after_optimizer() communicates (the trainer times it as gradient sync).
  virtual bool gathers_after_optimizer() const = 0;
  virtual void after_optimizer() = 0;
  // The compute copy of the parameters from the fp32 values, after initialisation, each
  // optimizer step and a resume (train.precision bf16 / fp16; nothing in fp32).
  virtual void refresh_compute() = 0;
  // The 16-bit compute copy indexed as optimizer_values(), when the optimizer can write it in
  // its own pass (then no refresh follows the step); an empty Tensor otherwise (fp32, or ZeRO-1/2,
  // whose copy is made from the values gathered after the step).
  virtual Tensor optimizer_compute() { return {}; }

  // Checkpoints: parameter values, and arrays indexed like segments() (Adam moments).
  virtual Holding values() = 0;
  virtual Holding state(float* local) = 0;

  // For reports: ZeRO stage (0: plain replication), ranks sharing one copy of the model
  // state, groups the strategy made itself, the latest reduction's timing (zero when the
  // strategy does not time one), a line for the summary (may be empty), and the settings
  // of the reduction ("overlap on, progress poll").
  virtual int zero_stage() const = 0;
  virtual int64_t shard_ranks() const = 0;
  virtual std::vector<Communicator*> own_groups() = 0;
  virtual const DpSyncTiming& last_sync() const = 0;
  virtual std::string summary() const = 0;
  virtual std::string sync_settings() const = 0;
  // Whether the hidden share of the reduction can be measured (not with progress = none).
  virtual bool sync_hidden_measured() const = 0;
};

// The strategy parallel.zero / shard_group select, over a store finalised with store_layout().
// expert_dp: the expert-data-parallel group (Group::edp), which reduces (and holds copies of)
// the routed experts a rank holds for its expert-parallel group only (Param::expert).
std::unique_ptr<DataParallel> make_data_parallel(const ParallelSection& o, ParamStore& store,
                                                 const Transformer& model, Communicator& dp,
                                                 Communicator& replicas, Allocator& alloc,
                                                 Communicator* expert_dp = nullptr);

}  // namespace tessera
