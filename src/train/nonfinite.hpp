// What a run does after a step whose loss or gradient norm is NaN or Inf
// (train.on_nonfinite; doc/checkpoints.md, "Non-finite steps and bad data"). The trainer has
// already dropped that step's update (StepResult::finite), so the model state is still the
// previous step's; this decides whether the run stops or skips, and reports a data fault
// that caused it (a token id out of range, the data file changed) once, from rank 0.
#pragma once

#include <cstdint>
#include <string>

#include "train/trainer.hpp"

namespace tessera {

class NonfiniteGuard {
 public:
  NonfiniteGuard(const TrainSection& train, Communicator& world);

  // After step r, on every rank (collective when !r.finite, which every rank sees alike).
  // A loss spike (r.spike, train.loss_spike): skipped and counted with the non-finite steps
  // (train.nonfinite_limit in a row stop the run), whatever train.on_nonfinite says.
  // A data fault on any rank: a checkpoint of the last good state (step r.step - 1, unless
  // last_saved is that step already) and a collective error carrying the fault. Otherwise
  // stop: a collective error; skip: one line from rank 0, and a collective error after
  // train.nonfinite_limit such steps in a row. Returns true when the step was skipped.
  bool after_step(const StepResult& r, Trainer& trainer, Checkpointer& ckpt, int64_t last_saved);
  // At the end of a run: a data fault seen only by validation is an error too.
  void after_run(const BlendedDataset& data);
  int64_t skipped() const { return skipped_; }

 private:
  // Counts a skipped step (kind: "skipped", "non-finite") and stops the run at the limit.
  bool skip_step(const std::string& what, const char* kind, const Checkpointer& ckpt);
  Communicator& world_;
  bool skip_;
  int64_t limit_, in_a_row_ = 0, skipped_ = 0;
  double spike_factor_;
  int64_t spike_window_;
};

// Test hook: TESSERA_FAULT_INJECT=nonfinite-at-step-N makes step N's loss NaN on every rank,
// nonfinite-from-step-N every step from N on.
bool injected_nonfinite(int64_t step);
// Test hook: TESSERA_FAULT_INJECT=loss-spike-at-step-N makes step N's loss 100 times what it
// is (before the loss-spike rule sees it), loss-spike-from-step-N every step from N on.
bool injected_spike(int64_t step);

}  // namespace tessera
