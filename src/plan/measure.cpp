#include "plan/measure.hpp"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "comm/communicator.hpp"
#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "perf/flops.hpp"

namespace tessera {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best of several GEMMs (m x k).(k x n), FLOP/s, all ranks running together.
double gemm_rate(Communicator& world, int64_t m, int64_t n, int64_t k) {
  std::vector<float> a(size_t(m * k), 0.5f), b(size_t(k * n), 0.25f), c(size_t(m * n));
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    world.barrier();
    const double t0 = now();
    kernels::matmul(view_of(a.data(), {m, k}), view_of(b.data(), {k, n}), view_of(c.data(), {m, n}),
                    m, n, k, false, false);
    if (rep > 0) best = std::min(best, now() - t0);
  }
  return 2.0 * double(m) * double(n) * double(k) / best;
}

// Bytes/s of a copy-scale-add triad over arrays far larger than the caches.
double triad_bandwidth(Communicator& world) {
  const size_t n = size_t(1) << 24;  // 64 MiB per array
  std::vector<float> a(n, 1.0f), b(n, 2.0f), c(n, 0.0f);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    world.barrier();
    const double t0 = now();
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) c[i] = a[i] + 0.5f * b[i];
    best = std::min(best, now() - t0);
  }
  if (c[n / 2] != 2.0f) std::fprintf(stderr, "triad check failed\n");
  return 3.0 * 4.0 * double(n) / best;
}

// All-reduce bus bandwidth (2 (n-1)/n x bytes / time) and per-hop latency of the world.
void allreduce_rates(Communicator& world, double& bw, double& latency) {
  const int n = world.size();
  const int count = 1 << 22;  // 16 MiB of floats
  const std::vector<float> x(size_t(count), 1.0f);
  std::vector<float> y;
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {
    y = x;
    world.barrier();
    const double t0 = now();
    world.all_reduce(y.data(), count);  // in place
    if (rep > 0) best = std::min(best, now() - t0);
  }
  world.all_reduce(&best, 1, ReduceOp::max);
  bw = n > 1 ? 2.0 * (n - 1) / n * 4.0 * count / best : 0;
  double small = 1e30;
  for (int rep = 0; rep < 200; ++rep) {
    float one = 1;
    world.barrier();
    const double t0 = now();
    world.all_reduce(&one, 1);
    small = std::min(small, now() - t0);
  }
  world.all_reduce(&small, 1, ReduceOp::max);
  latency = n > 1 ? small / (2.0 * (n - 1)) : 0;
}

double mean_over_ranks(Communicator& world, double x) {
  world.all_reduce(&x, 1);
  return x / world.size();
}

}  // namespace

void measure_cluster() {
  Communicator world(MPI_COMM_WORLD, "world");
  const int rank = world.rank(), n = world.size();
  // One process has no peer: its all-reduce bandwidth would be 0, a cluster file no planner
  // accepts.
  TESSERA_REQUIRE(n >= 2,
                  "--measure-cluster on 1 process cannot measure the node's "
                  "all-reduce bandwidth (node.bw_gbs); run it under mpiexec -n 2 or more (the "
                  "ranks per node a run will use)");
  const double peak = mean_over_ranks(world, gemm_rate(world, 1536, 1536, 1536));
  // The GEMM of tessera's train.precision = bf16 / fp16 (16-bit operands, fp32 accumulation).
  world.barrier();
  const double bf16 = mean_over_ranks(world, measure_gemm_flops(DType::bf16));
  world.barrier();
  const double fp16 = mean_over_ranks(world, measure_gemm_flops(DType::f16));
  // Efficiency against the thin dimension d: rate(d) / peak = d / (d + d_half), so each
  // measurement gives d_half = d (peak / rate - 1); the mean of those is reported.
  double half = 0;
  int samples = 0;
  for (int64_t d : {16, 32, 64, 128}) {
    const double r = mean_over_ranks(world, gemm_rate(world, 1536, 1536, d));
    if (r < peak) half += double(d) * (peak / r - 1), ++samples;
  }
  half = samples ? half / samples : 0;
  const double bw = mean_over_ranks(world, triad_bandwidth(world));
  double ar_bw = 0, ar_lat = 0;
  allreduce_rates(world, ar_bw, ar_lat);
  if (rank != 0) return;
  const double memory = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE)) / n;
  std::printf(
      "# Measured by `mpiexec -n %d tessera-plan --measure-cluster` (%d rank(s), %d "
      "thread(s) each):\n# every rank ran the benchmarks at once, as a training run "
      "loads the machine.\n",
      n, n, omp_get_max_threads());
  std::printf(
      "[cluster]\nname = this-machine\nnodes = 1\n\n[accelerator]\n"
      "name = cpu-rank\npeak_fp32_tflops = %.6g   # oneDNN fp32 GEMM 1536^3 per rank\n"
      "peak_bf16_tflops = %.6g   # bf16 operands, fp32 accumulation, 1536^3 per rank\n"
      "peak_fp16_tflops = %.6g   # fp16 operands (widened to fp32 on a CPU), 1536^3\n"
      "memory_gb = %.4g   # the machine's memory / ranks\n"
      "memory_bw_gbs = %.4g   # triad per rank\n"
      "gemm_efficiency = 1   # relative to the measured GEMM rate\n"
      "gemm_half_dim = %.3g   # from 1536x1536xd GEMMs, d = 16..128\n\n"
      "[node]\naccelerators = %d\nbw_gbs = %.4g   # MPI_Allreduce bus bandwidth, 16 MiB\n"
      "latency_us = %.3g\n",
      peak / 1e12, bf16 / 1e12, fp16 / 1e12, memory / 1e9, bw / 1e9, half, n, ar_bw / 1e9,
      ar_lat * 1e6);
}

}  // namespace tessera
