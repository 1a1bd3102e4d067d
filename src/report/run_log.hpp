// What a run tells its user: the progress line per step, metrics.jsonl, run.json and the
// closing summary (time per phase, memory per category, traffic per group) and memory.json. Rank 0
// writes; every rank takes part in the reductions.
#pragma once

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "comm/process_grid.hpp"
#include "config/run_config.hpp"
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
  // output.dir/memory.json: bytes per category (max over ranks), live and peak, and the
  // model-state formula (RankLayout::model_state, max over ranks).
  void write_memory_json(const double* peak, const double* live, double state_formula) const;
  void print_head() const;
  void print_activations(double measured, bool pipeline) const;
  int64_t held_expert_elements() const;
  int64_t routed_expert_elements() const;
  std::string per_block_json() const;
  const RunConfig& run_;
  ProcessGrid& grid_;
  // The last step's routing of every mixture-of-experts block of the model, whichever pipeline
  // stage holds it: gathered over the pp group (collective over the world) into moe_rows_.
  struct MoeRow {
    std::string name;
    double imbalance, dropped, routed, aux, z, bias_min, bias_max, cross, cross_free,
        run_cross, run_cross_free;
  };
  void gather_moe();
  std::string moe_json() const;
  void print_moe() const;
  std::vector<MoeRow> moe_rows_;
  Trainer& trainer_;
  bool root_;
  std::string dir_;
  int64_t log_every_;
  bool echo_;
  double peak_total_ = 0;
  std::string peak_source_;
  double flops_per_step_ = 0;
  double hardware_flops_per_step_ = 0;       // with the forward work recompute repeats (HFU)
  double elapsed_ = 0, steady_elapsed_ = 0;  // steady: excludes step 1 (allocation, warm-up)
  int64_t steady_steps_ = 0;
  double pp_wait_steady_ = 0, pp_compute_steady_ = 0;  // this rank's pipeline, steady steps
  int64_t steps_done_ = 0;
  double first_loss_ = 0, last_loss_ = 0;
  int64_t last_step_ = 0;  // the last step run (before train.steps after a stop signal)
  // Data-parallel gradient all-reduce per step (reduced over ranks as step() says), summed
  // over the steady steps and over all steps.
  DpSyncTiming dp_all_, dp_steady_;
  double dp_waited_all_ = 0, dp_waited_steady_ = 0;  // longest exposed time over ranks
  double phase_seen_[kPhaseCount] = {};              // this rank's phase totals at the last step()
  // Communication monitor (output.comm_warn_share): every group but world (tessera's own
  // per-step bookkeeping, mostly waiting for the slowest rank); the seconds in each one's
  // collectives on this rank at the last step(), and their mean over ranks summed over the
  // steady steps.
  std::vector<const Communicator*> monitored_;
  std::vector<double> comm_seen_, comm_steady_;
  // Steady-state share of the step time in collectives, and the group with the most of it.
  std::pair<double, size_t> comm_share() const;
  std::string monitored_name(size_t i) const;  // a monitored group's name in the warnings
  void print_comm_monitor() const;
  FILE* metrics_ = nullptr;
  // errno of a failed metrics.jsonl write on rank 0 (0: none); carried to every rank by the
  // next step's all-reduce (or finish's), which then stops the run with it.
  int write_errno_ = 0;
  void require_written(double write_errno) const;
};

}  // namespace tessera
