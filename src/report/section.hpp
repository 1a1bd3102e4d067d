// One feature's part of what a run reports (doc/architecture.md, "Reporting"): its lines before
// step 1, its bookkeeping and metrics.jsonl fields per step, its run.json entries and its
// lines of the closing summary. RunLog owns the common part (progress line, step and phase
// times, loss) and calls every hook of every section in one fixed order (report/sections.cpp),
// so the hooks that run on every rank may run collectives.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/process_grid.hpp"
#include "config/run_config.hpp"
#include "train/trainer.hpp"

namespace tessera {

// The run log's steps and times, which sections read. The first step of a run allocates and
// warms up, and is left out of the steady state.
struct RunTimes {
  int64_t steps_done = 0;     // before this run (resumed): its first step is steps_done + 1
  int64_t steady_steps = 0;   // steps after the first, so far
  double steady_seconds = 0;  // their time (each step's the maximum over ranks)
  bool first(const StepResult& r) const { return r.step == steps_done + 1; }
};

// What every section reads.
struct ReportInputs {
  const RunConfig& run;
  ProcessGrid& grid;
  Trainer& trainer;
  const RunTimes& times;
};

// The closing summary: the run log's loss and time per phase, then these parts in order
// (each every section's lines of it, in the sections' order), with the traffic table before
// communication and the plan comparison before closing.
enum class SummaryPart { state, activations, communication, closing };

class ReportSection {
 public:
  virtual ~ReportSection() = default;
  // Rank 0, before step 1: lines after the layout, model and batch.
  virtual std::string start() const { return {}; }
  // Rank 0: run.json entries, each ",\n  \"key\": value".
  virtual std::string run_json() const { return {}; }
  // Every rank, each step: numbers wanted as their maximum over ranks, appended to max; the
  // run log reduces them in its own all-reduce of the step and passes them to step().
  virtual void step_max(std::vector<double>&) {}
  // Every rank, each step, after that reduction (max: this section's numbers, reduced);
  // collectives allowed.
  virtual void step(const StepResult&, const double* /*max*/) {}
  // Rank 0: the progress line's addition (" | ..."), on the steps that print one.
  virtual std::string progress(const StepResult&) const { return {}; }
  // Rank 0, each step: metrics.jsonl fields, each ", \"key\": value".
  virtual std::string metrics(const StepResult&) const { return {}; }
  // Every rank, once after the last step; collectives allowed.
  virtual void gather() {}
  // Rank 0: lines of one part of the summary.
  virtual std::string summary(SummaryPart) const { return {}; }
};

}  // namespace tessera
