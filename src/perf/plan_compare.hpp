// The planner beside a finished run: tessera-plan's prediction (runtime tessera) of the
// step-time split and memory per category for the run's own layout, printed beside what the
// run measured, so a user sees where reality departs from the model. Called at the end of a
// run with output.compare_plan = true (report/run_log.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "config/choices.hpp"
#include "core/timer.hpp"
#include "model/config.hpp"
#include "parallel/rank_layout.hpp"
#include "tensor/tensor.hpp"

namespace tessera {

struct RunFacts {
  RankLayout layout;                // rank 0's (RankLayout: model split, batch, schedule, ZeRO)
  double gemm_flops_per_rank = 0;  // the GEMM rate the run measured (or the deck's peak)
  int64_t steps = 0;               // steps the phase times cover
  // Seconds per phase summed over the steps (mean over ranks), indexed by Phase.
  std::array<double, kPhaseCount> phase_seconds{};
  // Peak bytes per category, max over ranks, indexed by Charge.
  std::array<double, kChargeCount> memory_peak{};
  int zero_inflight = 2;  // parallel.zero_inflight
  std::string pp_layers = "balanced";
  ReduceDtype grad_reduce = ReduceDtype::fp32;  // parallel.grad_reduce_dtype
  bool document_mask = false;                   // data.document_mask
};

// Streaming (triad) bandwidth of this process, bytes/s.
double measure_stream_bandwidth();

// The comparison table. The machine is described from the run's GEMM rate, a triad measured
// now, and an assumed shared-memory MPI bandwidth (printed).
std::string plan_comparison(const RunFacts& run);

}  // namespace tessera
