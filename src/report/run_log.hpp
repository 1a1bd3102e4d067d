// What a run tells its user: the progress line per step, metrics.jsonl, run.json and the
// closing summary (time per phase, traffic per group, the plan comparison). Each feature that
// reports adds its own lines and fields as a section (report/section.hpp). Rank 0 writes;
// every rank takes part in the reductions.
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_grid.hpp"
#include "config/run_config.hpp"
#include "perf/plan_compare.hpp"
#include "report/sections.hpp"
#include "train/trainer.hpp"

namespace tessera {

class RunLog {
 public:
  // peak_flops_per_rank: from the deck, or measured when the deck gives 0.
  // steps_done > 0: a resumed run; metrics.jsonl is appended to, not replaced.
  RunLog(const RunConfig& run, ProcessGrid& grid, Trainer& trainer, int64_t steps_done = 0);
  ~RunLog();

  void start();                    // echo deck + layout, write run.json
  void step(const StepResult& r);  // progress line + metrics record
  void finish();                   // closing summary

  double peak_flops_total() const { return peak_total_; }

 private:
  // The plan comparison's facts about this run (output.compare_plan): phase_sum, seconds per
  // phase summed over ranks; mem, peak bytes per category (max over ranks); n ranks.
  RunFacts run_facts(const double* phase_sum, const double* mem, int n) const;
  void require_written(double write_errno) const;
  const RunConfig& run_;
  ProcessGrid& grid_;
  Trainer& trainer_;
  bool root_;
  std::string dir_;
  int64_t log_every_;
  bool echo_;
  double peak_total_ = 0;
  std::string peak_source_;
  double flops_per_step_ = 0;
  double hardware_flops_per_step_ = 0;  // with the forward work recompute repeats (HFU)
  double elapsed_ = 0;
  RunTimes times_;  // steady: excludes step 1 (allocation, warm-up)
  double first_loss_ = 0, last_loss_ = 0;
  int64_t last_step_ = 0;  // the last step run (before train.steps after a stop signal)
  double phase_seen_[kPhaseCount] = {};  // this rank's phase totals at the last step()
  // What each feature reports (report/sections.hpp), in their fixed order; memory_ is one of
  // them, whose peaks the plan comparison reads.
  std::vector<std::unique_ptr<ReportSection>> sections_;
  const MemorySection* memory_ = nullptr;
  FILE* metrics_ = nullptr;
  // errno of a failed metrics.jsonl write on rank 0 (0: none); carried to every rank by the
  // next step's all-reduce (or finish's), which then stops the run with it.
  int write_errno_ = 0;
};

}  // namespace tessera
