// The CPU attention core, forward + backward, with fp32 and bf16 products (AttnShape::compute)
// at two training shapes: the 6-layer GPT-2 (B 8, T 128, 8 heads of 64) and a long Llama
// sequence (B 1, T 1024, 8 query heads over 4 kv heads of 64).
//
//   tessera-attention-bench [--reps R]
//
// Each line gives the median of R runs after 2 warm-ups (wall time, all OpenMP threads).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/kernels.hpp"

namespace {

using tessera::DType;
using tessera::Shape;
using tessera::Tensor;
using tessera::kernels::AttnShape;

Tensor view(std::vector<float>& v) {
  return tessera::view_of(v.data(), Shape{int64_t(v.size())});
}

std::vector<float> randn(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

struct Case {
  const char* name;
  int64_t B, T, Hq, Hkv, D;
};

// Median seconds of forward, backward for one compute dtype.
void run(const Case& c, DType compute, int reps, double& fwd, double& bwd) {
  const size_t nq = size_t(c.B * c.T * c.Hq * c.D), nkv = size_t(c.B * c.T * c.Hkv * c.D);
  auto q = randn(nq, 1), k = randn(nkv, 2), v = randn(nkv, 3), dout = randn(nq, 4);
  std::vector<float> out(nq), lse(size_t(c.B * c.Hq * c.T)), dq(nq), dk(nkv), dv(nkv);
  const AttnShape s{c.B, c.T, c.Hq, c.Hkv,  c.D, float(1.0 / std::sqrt(double(c.D))),
                    0,   0,   0,    compute};
  std::vector<double> tf, tb;
  for (int r = 0; r < reps + 2; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    tessera::kernels::attention_forward(view(q), view(k), view(v), view(out), view(lse), s);
    const auto t1 = std::chrono::steady_clock::now();
    tessera::kernels::attention_backward(view(dout), view(q), view(k), view(v), view(out),
                                         view(lse), view(dq), view(dk), view(dv), s);
    const auto t2 = std::chrono::steady_clock::now();
    if (r < 2) continue;
    tf.push_back(std::chrono::duration<double>(t1 - t0).count());
    tb.push_back(std::chrono::duration<double>(t2 - t1).count());
  }
  std::sort(tf.begin(), tf.end());
  std::sort(tb.begin(), tb.end());
  fwd = tf[tf.size() / 2];
  bwd = tb[tb.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 10;
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
  const Case cases[] = {{"gpt2-6x512", 8, 128, 8, 8, 64}, {"llama-long", 1, 1024, 8, 4, 64}};
  std::printf("%d threads, median of %d\n", omp_get_max_threads(), reps);
  std::printf("%-12s %-5s %10s %10s %10s\n", "shape", "dtype", "fwd ms", "bwd ms", "total ms");
  for (const Case& c : cases)
    for (DType t : {DType::f32, DType::bf16}) {
      double f = 0, b = 0;
      run(c, t, reps, f, b);
      std::printf("%-12s %-5s %10.2f %10.2f %10.2f\n", c.name, tessera::dtype_name(t), 1e3 * f,
                  1e3 * b, 1e3 * (f + b));
    }
  return 0;
}
