// The Kokkos kernels in the host space (OpenMP) at the shapes of a GPT-2-small step: each one's
// time, the bytes it must move, and its bandwidth as a fraction of what the copy kernel reaches
// in the same run (all of them are memory-bound; doc/kokkos.md).
//
//   tessera-host-bench [--tokens N] [--reps R] [--cpu-time]
//
// Each kernel runs R times after 2 warm-ups; the table gives the median.
// --cpu-time measures the process's CPU time instead of wall time: with one thread
// (OMP_NUM_THREADS=1) that is the kernel's own time even on a loaded machine, where wall times
// are mostly other processes' time slices.
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.hpp"

namespace {

using tessera::kernels::AdamWArgs;
using tessera::kernels::Backend;

Backend kokkos_host() {
  namespace kk = tessera::kernels::kokkos;
  Backend b;
  b.name = "kokkos";
  kk::register_all(b, kk::Target::host);
  return b;
}

double now_ms(bool cpu_time) {
  timespec ts;
  clock_gettime(cpu_time ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 2048;
  int reps = 21;
  bool cpu_time = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--cpu-time")) cpu_time = true;
    else if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
  }
  const int64_t C = 768, H = 12, D = 64, F = 4 * C, V = 50304, Vv = 50257;
  const int64_t N = tokens, Nce = std::min<int64_t>(tokens, 512);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto randn = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = normal(rng);
    return v;
  };
  std::vector<float> x = randn(N * F), y = randn(N * F), z = randn(N * F), g = randn(N * F), u = randn(N * F);
  std::vector<float> w = randn(F), bias = randn(F), stat1(static_cast<size_t>(N)), stat2(static_cast<size_t>(N));
  std::vector<float> logits = randn(Nce * V), losses(static_cast<size_t>(Nce));
  std::vector<uint16_t> dlogits(static_cast<size_t>(Nce * V));
  std::vector<float> table = randn(Vv * C), dtable(static_cast<size_t>(Vv * C));
  std::vector<int32_t> ids(static_cast<size_t>(N));
  for (auto& id : ids) id = int32_t(rng() % uint32_t(Vv));
  std::vector<uint16_t> h(static_cast<size_t>(N * F));
  const int64_t P = 7 * 1000 * 1000;  // a ZeRO part's worth of AdamW
  std::vector<float> p = randn(P), pg = randn(P), pm(static_cast<size_t>(P)), pv(static_cast<size_t>(P));
  const AdamWArgs adam{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3};

  struct Case {
    const char* name;
    double bytes;  // read + written, at least
    std::function<void(const Backend&)> run;
  };
  const double f = 4.0, nf = double(N * F) * f, nc = double(N * C) * f;
  const std::vector<Case> cases = {
      {"copy N x 4C", 2 * nf, [&](const Backend& b) { b.copy(x.data(), y.data(), N * F); }},
      {"add_inplace N x 4C", 3 * nf, [&](const Backend& b) { b.add_inplace(y.data(), x.data(), N * F); }},
      {"sum_squares N x 4C", nf, [&](const Backend& b) { b.sum_squares(x.data(), N * F); }},
      {"bias_add N x 4C", 2 * nf, [&](const Backend& b) { b.bias_add(y.data(), bias.data(), N, F); }},
      {"bias_backward N x 4C", nf,
       [&](const Backend& b) { b.bias_backward(x.data(), bias.data(), N, F); }},
      {"f32_to_bf16 N x 4C", 1.5 * nf, [&](const Backend& b) { b.f32_to_bf16(x.data(), h.data(), N * F); }},
      {"rmsnorm_forward N x C", 2 * nc,
       [&](const Backend& b) {
         b.rmsnorm_forward(x.data(), w.data(), y.data(), nullptr, false, stat1.data(), N, C, 1e-5f);
       }},
      {"rmsnorm_backward N x C", 3 * nc,
       [&](const Backend& b) {
         b.rmsnorm_backward(g.data(), x.data(), w.data(), stat1.data(), z.data(), bias.data(), N,
                            C);
       }},
      {"layernorm_forward N x C", 2 * nc,
       [&](const Backend& b) {
         b.layernorm_forward(x.data(), w.data(), bias.data(), y.data(), nullptr, false,
                             stat1.data(), stat2.data(), N, C, 1e-5f);
       }},
      {"layernorm_backward N x C", 3 * nc,
       [&](const Backend& b) {
         b.layernorm_backward(g.data(), x.data(), w.data(), stat1.data(), stat2.data(), z.data(),
                              w.data() + C, bias.data(), N, C);
       }},
      {"swiglu_forward N x 4C", 3 * nf,
       [&](const Backend& b) { b.swiglu_forward(x.data(), z.data(), y.data(), N * F); }},
      {"swiglu_backward N x 4C", 5 * nf,
       [&](const Backend& b) {
         b.swiglu_backward(g.data(), x.data(), z.data(), y.data(), u.data(), N * F);
       }},
      {"gelu_forward N x 4C", 2 * nf, [&](const Backend& b) { b.gelu_forward(x.data(), y.data(), N * F); }},
      {"gelu_backward N x 4C", 3 * nf,
       [&](const Backend& b) { b.gelu_backward(g.data(), x.data(), y.data(), N * F); }},
      {"rope q N x C", 2 * nc,
       [&](const Backend& b) { b.rope(y.data(), nullptr, 1, N, H, D, 0, 10000.0f, false); }},
      {"embedding_forward N x C", 2 * nc,
       [&](const Backend& b) { b.embedding_forward(ids.data(), table.data(), y.data(), N, C); }},
      {"embedding_backward N x C", 3 * nc,
       [&](const Backend& b) { b.embedding_backward(ids.data(), x.data(), dtable.data(), N, C); }},
      {"cross_entropy 512 x V", 2.0 * f * double(Nce * V),
       [&](const Backend& b) {
         b.cross_entropy_fused(logits.data(), ids.data(), losses.data(), Nce, V, Vv, 1e-3f, nullptr,
                               false);
       }},
      {"cross_entropy 512 x V, bf16 gradient", 2.0 * f * double(Nce * V) * 3 / 4,
       [&](const Backend& b) {
         b.cross_entropy_fused(logits.data(), ids.data(), losses.data(), Nce, V, Vv, 1e-3f,
                               dlogits.data(), false);
       }},
      {"adamw 7M", 7.0 * f * double(P), [&](const Backend& b) {
         b.adamw(p.data(), pg.data(), pm.data(), pv.data(), P, adam, nullptr, false);
       }}};

  const Backend kk = kokkos_host();
  std::printf("Kokkos host kernels, %d threads, %lld tokens, median of %d runs (%s time)\n",
              omp_get_max_threads(), (long long)N, reps, cpu_time ? "CPU" : "wall");
  std::printf("| kernel | ms | GB/s | of copy's GB/s |\n|---|---:|---:|---:|\n");
  double copy_gbs = 0;
  for (const Case& c : cases) {
    std::vector<double> t;
    for (int r = 0; r < reps + 2; ++r) {
      if (c.name == std::string("cross_entropy 512 x V"))  // it overwrites its input
        std::copy(table.begin(), table.begin() + Nce * V, logits.begin());
      const double t0 = now_ms(cpu_time);
      c.run(kk);
      if (r >= 2) t.push_back(now_ms(cpu_time) - t0);
    }
    const double ms = median(t), gbs = c.bytes / (ms * 1e6);
    if (copy_gbs == 0) copy_gbs = gbs;  // the first case is the copy
    std::printf("| %s | %.3f | %.1f | %.2f |\n", c.name, ms, gbs, gbs / copy_gbs);
  }
  return 0;
}
