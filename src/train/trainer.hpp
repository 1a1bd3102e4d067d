// One training run's state and its step: data -> micro-batches forward/backward ->
// gradient reduction over data-parallel ranks -> clipping -> AdamW. The same code runs with
// one rank (the serial reference) or many.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_grid.hpp"
#include "config/run_config.hpp"
#include "core/timer.hpp"
#include "io/blended_dataset.hpp"
#include "io/checkpoint.hpp"
#include "kernels/kernels.hpp"
#include "model/pass_pair.hpp"
#include "model/transformer.hpp"
#include "optim/adamw.hpp"
#include "optim/lr_schedule.hpp"
#include "parallel/dp/data_parallel.hpp"
#include "parallel/pp/executor.hpp"
#include "parallel/rank_layout.hpp"
#include "train/document_batch.hpp"

namespace tessera {

struct StepResult {
  int64_t step = 0;
  double loss = 0, grad_norm = 0, lr = 0, seconds = 0;
  double val_loss = -1;  // negative: not evaluated this step
  // The unmasked targets of the global batch: the loss's denominator (global_batch x seq_len
  // without a loss mask; doc/data.md, "Loss masks").
  int64_t targets = 0;
  // A blend of several datasets: each one's validation loss (negative: it has no validation
  // split); val_loss is their mean weighted by the blend's weights. Empty for one dataset.
  std::vector<double> val_losses;
  // fp16: the loss scale the step ran with, and whether its gradients overflowed (the update
  // was skipped on every rank and the scale halved).
  double loss_scale = 1;
  bool skipped = false;
  // false: the loss or gradient norm is NaN or Inf (the same on every rank) and the update
  // was not applied; train/nonfinite.hpp decides what follows.
  bool finite = true;
  // train.loss_spike: the loss exceeded k times the running mean (the same on every rank:
  // the loss is reduced over all of them) and the update was not applied.
  bool spike = false;
  double spike_mean = 0;  // the running mean it was compared with
};

// The loss-spike rule (train.loss_spike = k, train.loss_spike_window = n): a finite loss above
// k times the mean of the last n applied steps' losses is a spike; the rule waits until n
// losses are known. Its window is not checkpointed: after a resume it fills again.
struct SpikeRule {
  double factor = 0;  // 0: off
  size_t window = 20;
  std::vector<double> recent;  // ring of the last applied losses
  size_t next = 0;
  double mean() const;
  bool is_spike(double loss) const;
  void applied(double loss);
};

// fp16 dynamic loss scaling (train.precision = fp16): the summed token losses are multiplied by
// the scale before backward, so small gradients survive fp16; a step whose gradients overflow
// (a non-finite global norm, found by the reduction every rank already does for clipping) is
// skipped on every rank and halves the scale; window steps without overflow double it. Other
// precisions keep the scale at 1.
struct LossScaler : LossScaling {
  int64_t good = 0, skipped = 0;
  // After a step's global gradient norm (scaled): whether to apply the update.
  bool update(double scaled_norm);
};

class Trainer {
 public:
  // layout: what the run's layout means for this rank (RankLayout::make, which checked it).
  // before_allocating: called on every rank once the data is open and checked, before the
  // model state is allocated (tessera checks there that the model fits in memory).
  Trainer(const RunConfig& run, ProcessGrid& grid, const RankLayout& layout,
          const std::function<void()>& before_allocating = {});
  // The same with this rank's layout made here.
  Trainer(const RunConfig& run, ProcessGrid& grid);

  // Runs optimizer step number step (1-based).
  StepResult step(int64_t step);
  const BlendedDataset& data() const { return data_; }
  // The dtype of the GEMM operands and the parameters' compute copy (train.precision).
  DType compute_dtype() const { return store_.compute_dtype(); }
  const LossScaler& loss_scaler() const { return scaler_; }
  // Writes the state after `step` completed steps (collective).
  void save(Checkpointer& ckpt, int64_t step);
  // Restores the state checkpoint.resume names; returns the steps already completed (0 for a
  // fresh start). for_sampling: the data position need not match this deck's batch.
  int64_t restore(Checkpointer& ckpt, bool for_sampling = false);
  // Mean validation loss over train.eval_samples held-out sequences (collective): of each
  // dataset of a blend that has a validation split, and their mean weighted by the blend
  // (r.val_loss, r.val_losses).
  void evaluate(StepResult& r);
  bool eval_due(int64_t step, int64_t last_step) const;
  // The tokens of global sample g of step s: out[seq_len + 1], and their loss mask when mask is
  // not null (1 everywhere for a dataset without one).
  void sample(int64_t step, int64_t g, int32_t* out, uint8_t* mask = nullptr,
              int32_t* doc = nullptr) const;

  const RankLayout& layout() const { return layout_; }
  const ModelConfig& config() const { return cfg_; }
  const BatchGeometry& batch() const { return geo_; }
  ParamStore& params() { return store_; }
  Transformer& model() { return *model_; }
  const Transformer& model() const { return *model_; }
  // The run's memory: device memory under hardware.device = cuda (its host() then holds the
  // staging buffers of the copies to and from it).
  Allocator& allocator() { return alloc_; }
  const PhaseTimer& timer() const { return timer_; }
  // How gradients are reduced and the model state is held over data-parallel ranks.
  DataParallel& data_parallel() const { return *dp_; }
  // Groups the trainer made itself (ZeRO shard/replica groups), for the traffic table.
  std::vector<const Communicator*> own_groups() const;
  StepContext context(bool training);
  // The checkpoint's tensors (parameter values and Adam moments) as this rank holds them:
  // whole, or its ZeRO pieces. In device memory they are host copies (staging_), filled from
  // the device by this call; restore() copies them back after a load.
  std::vector<CheckpointTensor> checkpoint_tensors();
  int zero_stage() const { return dp_->zero_stage(); }
  // A tied token table split over pipeline stages: the first stage's table and the last
  // stage's copy, kept identical by summing their gradients over the embedding group.
  // (Not in a V-shaped schedule, whose first stage holds the embedding and the head.)
  bool tied_over_pipeline() const {
    return cfg_.tie_embeddings && grid_.group(Group::pp).size() > 1 &&
           grid_.group(Group::embedding).size() > 1 && layout_.schedule.loss_stage() != 0;
  }
  // Data-parallel ranks sharing one copy of the model state (ZeRO shard group); 1 without ZeRO.
  int64_t shard_ranks() const { return dp_->shard_ranks(); }
  std::string layout_json() const;
  // The pipeline executor when there are several stages (every step runs through it; with
  // one stage it is the serial loop and reports no pipeline).
  const pp::Executor* pipeline() const {
    return pipeline_ && pipeline_->shape().stages > 1 ? pipeline_.get() : nullptr;
  }
  // Steps, phases, pipeline passes and messages, and the collectives of the groups the
  // trainer made itself become spans of trace (null: none); ProcessGrid::set_trace covers
  // the grid's groups.
  void set_trace(Trace* trace);
  int64_t steps() const { return steps_; }
  // Context parallelism's ring: how much of its K/V (and dK/dV) traffic attention hid.
  const OverlapTiming& cp_timing() const { return cp_timing_; }
  const OverlapTiming& ep_timing() const { return ep_timing_; }
  // DualPipe's paired overlap (parallel/pp/paired_overlap.hpp): the runner of the interleaved
  // pairs (null when they run one pass after the other) and why not ("" when they interleave).
  const PassPair* pass_pair() const { return pair_.get(); }
  const std::string& paired_overlap_off() const { return pair_off_; }
  // Blocks per model chunk of the pipeline (parallel.pp_layers; empty with one stage).
  const std::vector<int64_t>& chunk_layers() const { return layout_.chunk_layers; }

 private:
  // Fills tokens_ row by row (sample_row(b, row, mask, doc) writes seq_len + 1 tokens, their
  // loss mask and, with document masking, their documents' starts) and splits them into
  // inputs_ and targets_, a masked target written as -1 (the cross-entropy's ignore index), and
  // the documents into slot `slot` of docs_; returns the number of unmasked targets loaded
  // (this rank's segments of the sequences under context parallelism).
  int64_t load_micro_batch(
      const std::function<void(int64_t, int32_t*, uint8_t*, int32_t*)>& sample_row, int slot);
  // A warning when the tensor-parallel group spans nodes.
  void warn_tp_across_nodes();
  // One step's micro-batches through this stage's op list; returns the summed token loss
  // (non-zero only on the last stage), and in *targets the unmasked targets it loaded (also
  // counted on the last stage only).
  double pipeline_step(int64_t step, StepContext& ctx, double* targets);
  double pipeline_evaluate(size_t dataset);
  // The checkpoint names and global shapes of the whole model, in registration order (a
  // stage holds only some of them; every rank passes all).
  void index_whole_model();
  // h in host memory: h itself, or (device memory) its array copied into staging buffer i.
  Holding host_copy(const Holding& h, size_t i);
  // After a checkpoint load into the staging buffers: copies them to the device arrays.
  void unstage();

  const RunConfig& run_;
  RankLayout layout_;
  ModelConfig cfg_;
  BatchGeometry geo_;
  ProcessGrid& grid_;
  ParallelContext par_;
  std::unique_ptr<kernels::Device> device_;  // hardware.device = cuda
  Allocator host_alloc_;                     // host staging memory of a device run
  Allocator alloc_;
  Scratch scratch_;
  ParamStore store_;
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<AdamW> optim_;
  std::unique_ptr<DataParallel> dp_;
  LrSchedule schedule_;
  double grad_clip_ = 0;
  LossScaler scaler_;
  SpikeRule spike_;
  uint64_t seed_ = 0;
  int64_t steps_ = 0;
  BlendedDataset data_;
  int64_t eval_every_ = 0, eval_samples_ = 0;
  Buffer tokens_, inputs_, targets_;  // one micro-batch (tokens_ in host memory)
  // tokens_'s loss mask, B x (seq_len + 1) bytes sized once (host; not in the ledger, as the
  // loader's own read buffer of io/token_dataset.cpp is not).
  std::vector<uint8_t> mask_;
  Buffer host_inputs_, host_targets_;  // device run: inputs_ and targets_ as loaded, on the host
  struct Staged {  // device run: a host copy of a flat array the checkpoint reads or writes
    float* device = nullptr;
    int64_t n = 0;
    Buffer host;
  };
  std::vector<Staged> staging_;
  std::unique_ptr<pp::Executor> pipeline_;
  Buffer pp_inputs_, pp_targets_;  // every micro-batch of a step (pipeline)
  DocumentBatch docs_;             // data.document_mask: the micro-batches' documents
  // The parts' hooks with several stages: data parallelism's, then a poll of the pipeline's
  // messages in flight (pp::Executor::poll), so they move while the stage computes.
  struct PipelineHooks : PartHooks {
    PartHooks* dp = nullptr;
    pp::Executor* pipeline = nullptr;
    void begin(int part, Pass pass, bool training) override { dp->begin(part, pass, training); }
    void end(int part, Pass pass, bool training) override {
      dp->end(part, pass, training);
      pipeline->poll();
    }
  } pipeline_hooks_;
  struct WholeParam {
    std::string name;
    Shape global;
  };
  std::vector<WholeParam> whole_model_;
  PhaseTimer timer_;
  Trace* trace_ = nullptr;
  OverlapTiming cp_timing_, ep_timing_;
  std::unique_ptr<PassPair> pair_;
  std::unique_ptr<Scratch> pair_scratch_;  // the backward_input's scratch inside a pair
  std::string pair_off_;
};

}  // namespace tessera
