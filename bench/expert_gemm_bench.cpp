// Why the routed experts run as a loop of GEMMs (doc/moe.md, "Expert parallelism"): the time
// of E per-expert GEMMs over N k / E rows each (the balanced case; dropless routing gives
// varying rows) against one GEMM over all N k rows with the same weights' shape, which is the
// most a grouped GEMM could reach, forward (x W1) in fp32 on the CPU backend (oneDNN).
//
//   tessera-expert-gemm-bench [--reps R]
//
// Each case runs R times after 2 warm-ups; the table gives the median wall time and GFLOP/s.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/kernels.hpp"
#include "timing.hpp"

using tessera::bench::median_ms;

int main(int argc, char** argv) {
  using namespace tessera;
  int reps = 11;
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
  struct Case {
    const char* name;
    int64_t tokens, d_model, ffn, experts, top_k;
  };
  const Case cases[] = {{"tiny-moe (the test deck)", 256, 64, 64, 8, 2},
                          {"small: 2048 tokens, d 512, ffn 1408", 2048, 512, 1408, 8, 2},
                          {"small, 64 experts top 6", 2048, 512, 352, 64, 6}};
  std::printf("| shape | experts x rows | loop of GEMMs, ms | one GEMM, ms | loop GFLOP/s | one GFLOP/s | loop / one |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|\n");
  for (const Case& s : cases) {
    const int64_t rows = s.tokens * s.top_k, per = rows / s.experts, C = s.d_model, F = s.ffn;
    std::vector<float> x(size_t(rows * C), 0.01f), w(size_t(s.experts * C * F), 0.02f),
        y(size_t(rows * F));
    const double loop = median_ms(reps, [&] {
      for (int64_t e = 0; e < s.experts; ++e)
        kernels::matmul(view_of(x.data() + e * per * C, Shape{per, C}),
                        view_of(w.data() + e * C * F, Shape{C, F}),
                        view_of(y.data() + e * per * F, Shape{per, F}), per, F, C, false, false);
    });
    const double one = median_ms(reps, [&] {
      kernels::matmul(view_of(x.data(), Shape{rows, C}), view_of(w.data(), Shape{C, F}),
                      view_of(y.data(), Shape{rows, F}), rows, F, C, false, false);
    });
    const double gflop = 2.0 * double(rows) * double(C) * double(F) * 1e-9;
    std::printf("| %s | %lld x %lld | %.3f | %.3f | %.1f | %.1f | %.2f |\n", s.name,
                (long long)s.experts, (long long)per, loop, one, gflop / (loop * 1e-3),
                gflop / (one * 1e-3), loop / one);
  }
  return 0;
}
