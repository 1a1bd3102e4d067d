// The communication monitor (output.comm_warn_share): every group but world (tessera's own
// per-step bookkeeping, mostly waiting for the slowest rank); the seconds in each one's
// collectives per step, mean over ranks, summed over the steady steps. Above the threshold
// the progress line says so, and the summary names the dominant group with what usually
// lowers its time (seed 002: fix the layout, not the code).
#include <utility>

#include "report/sections.hpp"
#include "report/text.hpp"

namespace tessera {
namespace {

class CommMonitor final : public ReportSection {
 public:
  explicit CommMonitor(const ReportInputs& in)
      : grid_(in.grid), times_(in.times), warn_(in.run.output.comm_warn_share) {
    for (Group g : kAllGroups) monitored_.push_back(&grid_.group(g));
    for (const Communicator* c : in.trainer.own_groups()) monitored_.push_back(c);
    for (const Communicator* c : monitored_) seen_.push_back(c->stats().seconds);
    steady_.assign(monitored_.size(), 0.0);
  }

  // This step's seconds in each group's collectives, mean over ranks.
  void step(const StepResult& r, const double*) override {
    std::vector<double> comm(monitored_.size());
    for (size_t i = 0; i < comm.size(); ++i) {
      const double now = monitored_[i]->stats().seconds;
      comm[i] = now - seen_[i], seen_[i] = now;
    }
    if (!comm.empty()) grid_.world().all_reduce(comm.data(), int64_t(comm.size()));
    if (!times_.first(r))
      for (size_t i = 0; i < comm.size(); ++i) steady_[i] += comm[i] / double(grid_.world().size());
  }

  std::string progress(const StepResult&) const override {
    if (const auto [share, g] = comm_share(); warn_ > 0 && times_.steady_steps > 0 && share > warn_)
      return formatted(" | comm %.0f%% > %.0f%% (%s)", 100 * share, 100 * warn_,
                       monitored_name(g).c_str());
    return {};
  }

  std::string summary(SummaryPart part) const override;

 private:
  // Steady-state share of the step time in collectives, and the group with the most of it.
  std::pair<double, size_t> comm_share() const;
  std::string monitored_name(size_t i) const;  // a monitored group's name in the warnings

  ProcessGrid& grid_;
  const RunTimes& times_;
  double warn_;
  std::vector<const Communicator*> monitored_;
  std::vector<double> seen_;    // seconds in each one's collectives on this rank at the last step
  std::vector<double> steady_;  // per step, mean over ranks, summed over the steady steps
};

// The data-parallel gradients are reduced over dp_cp (the data- and context-parallel ranks);
// without context parallelism that group is the dp group, and is called so.
std::string CommMonitor::monitored_name(size_t i) const {
  const std::string& name = monitored_[i]->name();
  return name == "dp_cp" && grid_.group(Group::cp).size() == 1 ? "dp" : name;
}

std::pair<double, size_t> CommMonitor::comm_share() const {
  double total = 0;
  size_t top = 0;
  for (size_t i = 0; i < steady_.size(); ++i) {
    total += steady_[i];
    if (steady_[i] > steady_[top]) top = i;
  }
  return {times_.steady_seconds > 0 ? total / times_.steady_seconds : 0.0, top};
}

std::string CommMonitor::summary(SummaryPart part) const {
  if (part != SummaryPart::communication) return {};
  const double warn = warn_;
  if (times_.steady_steps == 0)
    return "communication: no steady-state step (the first step of a run is warm-up)\n";
  const auto [share, top] = comm_share();
  const std::string name = steady_.empty() ? "" : monitored_name(top);
  if (warn <= 0 || share <= warn)
    return formatted(
        "communication: %.1f%% of the steady-state step time in collectives (mean over "
        "ranks, world excluded); the warning is above %.0f%% (output.comm_warn_share)\n",
        100 * share, 100 * warn);
  std::string advice = "";
  if (name == "tp")
    advice =
        "tensor parallelism reduces every layer's activations: keep parallel.tp within "
        "a node, or lower it";
  else if (name == "pp")
    advice =
        "pipeline messages and the waits of the bubble: more micro-batches per step or "
        "fewer stages";
  else if (name == "dp" || name == "dp_cp" || name == "edp" || name == "embedding")
    advice =
        "the gradient reduction: more micro-batches per step (train.global_batch), fewer "
        "data-parallel ranks, or parallel.grad_reduce_dtype = bf16";
  else
    advice = "see the traffic table above";
  return formatted(
      "communication: WARNING: %.1f%% of the steady-state step time in collectives "
      "(mean over ranks, world excluded), above output.comm_warn_share = %.0f%%; the "
      "%s group dominates (%.3f s of %.3f s over %lld steady steps): %s\n",
      100 * share, 100 * warn, name.c_str(), steady_[top], share * times_.steady_seconds,
      (long long)times_.steady_steps, advice.c_str());
}

}  // namespace

std::unique_ptr<ReportSection> comm_monitor_section(const ReportInputs& in) {
  return std::make_unique<CommMonitor>(in);
}

}  // namespace tessera
