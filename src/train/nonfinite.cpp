#include "train/nonfinite.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "comm/agree.hpp"
#include "core/error.hpp"
#include "core/fault_inject.hpp"

namespace tessera {

NonfiniteGuard::NonfiniteGuard(const TrainSection& train, Communicator& world)
    : world_(world),
      skip_(train.on_nonfinite == OnNonfinite::skip),
      limit_(train.nonfinite_limit),
      spike_factor_(train.loss_spike),
      spike_window_(train.loss_spike_window) {}

bool NonfiniteGuard::after_step(const StepResult& r, Trainer& trainer, Checkpointer& ckpt,
                                int64_t last_saved) {
  if (r.spike) {  // train.loss_spike: skipped whatever train.on_nonfinite says
    const std::string what =
        cat("step ", r.step, ": the loss ", r.loss, " is above ", spike_factor_, " x the mean ",
            r.spike_mean, " of the last ", spike_window_, " steps (train.loss_spike)");
    return skip_step(what, "skipped", ckpt);
  }
  if (r.finite) {
    in_a_row_ = 0;
    return false;
  }
  // A data fault explains the NaN (the trainer poisons the loss of a faulty step): keep the
  // state of the step before, then stop with the fault's message.
  const std::string& fault = trainer.data().fault();
  int64_t faulty = fault.empty() ? 0 : 1;
  world_.all_reduce(&faulty, 1, ReduceOp::max);
  if (faulty) {
    const int64_t good = r.step - 1;  // 0: nothing trained yet
    if (good > last_saved) trainer.save(ckpt, good);
    agree_or_throw(world_, fault.empty(),
                   good > 0
                       ? cat(fault, "; step ", r.step,
                             " was not applied, and the run "
                             "stopped with the checkpoint of step ",
                             good)
                       : cat(fault, "; the run stopped at step ", r.step, ", before any update"));
  }
  const std::string what =
      cat("step ", r.step, ": the loss is ", r.loss, " and the gradient norm ", r.grad_norm);
  TESSERA_REQUIRE(skip_, what,
                  "; the update was not applied and no checkpoint of it is "
                  "written (those in '",
                  ckpt.dir(),
                  "' are kept); lower optim.lr, check "
                  "optim.eps and the data, or set train.on_nonfinite = skip");
  return skip_step(what, "non-finite", ckpt);
}

bool NonfiniteGuard::skip_step(const std::string& what, const char* kind,
                               const Checkpointer& ckpt) {
  ++in_a_row_, ++skipped_;
  TESSERA_REQUIRE(in_a_row_ < limit_, what, "; ", in_a_row_, " ", kind, " steps in a row ",
                  "(train.nonfinite_limit = ", limit_, "), so the run stops; the checkpoints in '",
                  ckpt.dir(), "' are kept");
  if (world_.rank() == 0)
    std::printf(
        "%s: update skipped (%lld in a row, %lld in all; the run stops after %lld in a "
        "row, train.nonfinite_limit)\n",
        what.c_str(), (long long)in_a_row_, (long long)skipped_, (long long)limit_);
  return true;
}

bool injected_nonfinite(int64_t step) {
  return fault_injected_at_step("nonfinite", step);
}

bool injected_spike(int64_t step) {
  return fault_injected_at_step("loss-spike", step);
}

void NonfiniteGuard::after_run(const BlendedDataset& data) {
  agree_or_throw(world_, data.fault().empty(), data.fault());
}

}  // namespace tessera
