#include "perf/plan_compare.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <vector>

#include "perf/cost_model.hpp"
#include "perf/tessera_memory.hpp"

namespace tessera {
namespace {

std::string line(const char* name, double predicted, double measured) {
  char buf[160];
  if (predicted > 0)
    std::snprintf(buf, sizeof buf, "%-12s %12.4f %12.4f %10.2f\n", name, predicted, measured,
                  measured / predicted);
  else
    std::snprintf(buf, sizeof buf, "%-12s %12s %12.4f %10s\n", name, "-", measured, "-");
  return buf;
}

}  // namespace

double measure_stream_bandwidth() {
  const size_t n = size_t(1) << 23;  // 32 MiB per array
  std::vector<float> a(n, 1.0f), b(n, 2.0f), c(n, 0.0f);
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) c[i] = a[i] + 0.5f * b[i];
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return c[n / 2] == 2.0f ? 3.0 * 4.0 * double(n) / best : 0;
}

std::string plan_comparison(const RunFacts& run) {
  const RankLayout& r = run.layout;
  const ModelConfig& c = r.model;
  const int ranks = r.degrees.tp * r.degrees.cp * r.degrees.dp * r.degrees.pp;
  const ComputeType precision = precision_names(c.compute).planner;
  // This machine as the planner sees it.
  Cluster cl;
  cl.name = "this run's machine";
  cl.accelerator = "cpu-rank";
  cl.per_node = ranks;
  // The measured rate is that of the run's precision; the planner reads it from its slot.
  cl.peak_fp32 = run.gemm_flops_per_rank;
  if (precision == ComputeType::bf16) cl.peak_bf16 = run.gemm_flops_per_rank;
  if (precision == ComputeType::fp16) cl.peak_fp16 = run.gemm_flops_per_rank;
  cl.memory = 1e15;
  cl.memory_bw = std::max(1e9, measure_stream_bandwidth());
  cl.gemm_efficiency = 1;  // the rate is a measured GEMM rate already
  cl.gemm_half_dim = 0;
  cl.intra = {2e9, 1e-6, "intra-node"};  // shared-memory MPI: assumed, not measured
  cl.inter = cl.pod = cl.intra;
  Workload w;
  w.cfg = c;
  w.cfg.tp = TensorParallel{};
  w.cfg.cp = ContextParallel{};
  w.cfg.experts_held = ExpertShard{};
  w.cp_kind = c.cp.kind;
  w.global_batch = r.batch.global_batch;
  w.zero_inflight = run.zero_inflight;
  w.pp_layers = run.pp_layers;
  w.document_mask = run.document_mask;
  if (w.cfg.moe.enabled()) {  // as workload_from (plan/workload.cpp) reads a deck's experts
    w.moe.experts = int(w.cfg.moe.experts);
    w.moe.top_k = int(w.cfg.moe.top_k);
    w.moe.expert_ffn = w.cfg.moe.ffn;
  }
  Layout l = tessera_layout(r);
  if (run.grad_reduce == ReduceDtype::bf16) l.grad_bytes = 2;
  std::string out = "\n== plan comparison (tessera-plan --runtime tessera; doc/planning.md) ==\n";
  const std::string problem = layout_problem(w, l, cl, Runtime::tessera, ranks);
  if (!problem.empty()) return out + "the planner cannot cost this layout: " + problem + "\n";
  const Estimate e = estimate(w, l, cl, Runtime::tessera);
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "machine: GEMM %.1f GFLOP/s per rank (the run's), memory %.1f GB/s (triad, "
                "now), MPI %.1f GB/s per rank (assumed)\nlayout: %s\n",
                cl.peak_fp32 / 1e9, cl.memory_bw / 1e9, cl.intra.bw / 1e9, to_string(l).c_str());
  out += buf;
  const double steps = double(std::max<int64_t>(run.steps, 1));
  const TimeBreakdown& t = e.time;
  // TP all-reduces run inside the layers: half in forward, half in backward.
  const double fwd = t.forward + 0.5 * t.tp_comm, bwd = t.backward + 0.5 * t.tp_comm;
  const double sync = t.dp_comm - t.dp_hidden;
  auto m = [&](Phase p) { return run.phase_seconds[size_t(p)] / steps; };
  double measured_step = 0;
  for (double s : run.phase_seconds) measured_step += s / steps;
  out +=
      "\nper step     predicted s   measured s   measured/predicted (measured: mean over "
      "ranks and steps, step 1 included)\n";
  out += line("forward", fwd, m(Phase::forward));
  out += line("backward", bwd, m(Phase::backward));
  out += line("grad sync", sync, m(Phase::grad_sync));
  out += line("optimizer", t.optimizer, m(Phase::optimizer));
  out += line("data", 0, m(Phase::data));
  out += line("other", 0, m(Phase::other));
  out += line("step", e.step_seconds, measured_step);
  const MemoryBreakdown& p = e.memory;
  std::array<double, kChargeCount> predicted{};
  predicted[size_t(Charge::params)] = p.params;
  predicted[size_t(Charge::grads)] = p.grads;
  predicted[size_t(Charge::optimizer)] = p.optimizer;
  predicted[size_t(Charge::activations)] = p.activations;
  predicted[size_t(Charge::comm)] = p.comm;
  predicted[size_t(Charge::workspace)] = p.workspace;
  out +=
      "\nmemory       predicted MiB measured MiB   measured/predicted (peak per rank, max over "
      "ranks)\n";
  for (size_t c = 0; c < predicted.size(); ++c) {
    std::snprintf(buf, sizeof buf, "%-12s %12.2f %12.2f %10s\n", charge_name(Charge(c)),
                  predicted[c] / 1048576, run.memory_peak[c] / 1048576,
                  predicted[c] > 0
                      ? std::to_string(run.memory_peak[c] / predicted[c]).substr(0, 5).c_str()
                      : "-");
    out += buf;
  }
  return out;
}

}  // namespace tessera
