// Where a step's GEMM time goes: every GEMM of one training step of a GPT-2-style model, with
// the shapes and transposes tessera's Linear and OutputHead pass to kernels::matmul, timed on
// the CPU backend (oneDNN) in fp32 and bf16, each against the 1536^3 GEMM of its precision
// measured in the same process (the rate MFU is computed against, doc/performance.md).
//
//   tessera-step-gemm-bench [--tokens N] [--d-model C] [--ffn F] [--vocab V] [--reps R]
//
// Defaults: bench/gpt2-6x512.in (1024 tokens, d_model 512, ffn 2048, vocab 50304 padded).
// Each GEMM runs R times after 2 warm-ups; the table gives the median and GFLOP/s. Then the
// head's GEMMs in vocabulary tiles (bf16), their "/ peak" counting the model's three GEMMs.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/kernels.hpp"
#include "timing.hpp"

namespace {

using namespace tessera;

using bench::median_ms;

// C[M, N] (+)= op(A) op(B) with operands of dtype t; fp32 output, as the step's GEMMs.
struct Gemm {
  const char* name;
  int64_t M, N, K;
  bool ta, tb;
};

double run(const Gemm& g, DType t, int reps) {
  const size_t w = t == DType::f32 ? 4 : 2;
  std::vector<char> a(size_t(g.M * g.K) * w, 0), b(size_t(g.K * g.N) * w, 0);
  std::vector<float> c(size_t(g.M * g.N), 0.0f);
  const Tensor A = view_of(a.data(), t, Shape{g.ta ? g.K : g.M, g.ta ? g.M : g.K});
  const Tensor B = view_of(b.data(), t, Shape{g.tb ? g.N : g.K, g.tb ? g.K : g.N});
  const Tensor C = view_of(c.data(), Shape{g.M, g.N});
  return median_ms(reps, [&] { kernels::matmul(A, B, C, g.M, g.N, g.K, g.ta, g.tb); });
}

}  // namespace

int main(int argc, char** argv) {
  int64_t N = 1024, C = 512, F = 2048, V = 50304;
  int reps = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    const int64_t v = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--tokens")) N = v;
    else if (!std::strcmp(argv[i], "--d-model")) C = v;
    else if (!std::strcmp(argv[i], "--ffn")) F = v;
    else if (!std::strcmp(argv[i], "--vocab")) V = v;
    else if (!std::strcmp(argv[i], "--reps")) reps = int(v);
  }
  // Forward y = x W^T (W is [out, in]); backward dW += dy^T x, dx = dy W.
  const Gemm step[] = {
      {"qkv forward", N, 3 * C, C, false, true},   {"qkv dW", 3 * C, C, N, true, false},
      {"qkv dx", N, C, 3 * C, false, false},       {"proj forward", N, C, C, false, true},
      {"proj dW", C, C, N, true, false},           {"proj dx", N, C, C, false, false},
      {"fc1 forward", N, F, C, false, true},       {"fc1 dW", F, C, N, true, false},
      {"fc1 dx", N, C, F, false, false},           {"fc2 forward", N, C, F, false, true},
      {"fc2 dW", C, F, N, true, false},            {"fc2 dx", N, F, C, false, false},
      {"head logits", N, V, C, false, true},       {"head dW", V, C, N, true, false},
      {"head dx", N, C, V, false, false},
  };
  const Gemm peak{"1536^3", 1536, 1536, 1536, false, false};
  std::printf("tokens %lld, d_model %lld, ffn %lld, vocab %lld; median of %d\n\n", (long long)N,
              (long long)C, (long long)F, (long long)V, reps);
  std::printf("| GEMM | M x N x K | fp32 ms | fp32 / peak | bf16 ms | bf16 / peak |\n");
  std::printf("|---|---|---:|---:|---:|---:|\n");
  const double p32 = 2.0 * 1536 * 1536 * 1536 / (run(peak, DType::f32, reps) * 1e-3);
  const double p16 = 2.0 * 1536 * 1536 * 1536 / (run(peak, DType::bf16, reps) * 1e-3);
  double t32 = 0, t16 = 0, flops = 0;
  for (const Gemm& g : step) {
    const double f = 2.0 * double(g.M) * double(g.N) * double(g.K);
    const double a = run(g, DType::f32, reps), b = run(g, DType::bf16, reps);
    t32 += a, t16 += b, flops += f;
    std::printf("| %s | %lld x %lld x %lld | %.3f | %.0f%% | %.3f | %.0f%% |\n", g.name,
                (long long)g.M, (long long)g.N, (long long)g.K, a, 100 * f / (a * 1e-3) / p32, b,
                100 * f / (b * 1e-3) / p16);
  }
  std::printf("| one block + head | | %.3f | %.0f%% | %.3f | %.0f%% |\n", t32,
              100 * flops / (t32 * 1e-3) / p32, t16, 100 * flops / (t16 * 1e-3) / p16);
  std::printf("\npeak (1536^3): fp32 %.1f GF/s, bf16 %.1f GF/s\n", p32 * 1e-9, p16 * 1e-9);

  // The head in vocabulary tiles (train.head_vocab_tile, model/output_head.cpp): per chunk of
  // 512 rows and tile of T columns the logits GEMM twice (statistics, then gradient), the
  // weight gradient's rows of the tile and the input gradient summed over the tiles; the
  // GEMMs of all N rows, against the three whole-vocabulary GEMMs above.
  std::printf("\nthe head in vocabulary tiles, %lld rows in chunks of 512, bf16 (logits twice):\n\n",
              (long long)N);
  std::printf("| tile | logits ms (x2) | dW ms | dx ms | in all ms | in all / peak |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|\n");
  const int64_t R = std::min<int64_t>(N, 512);
  std::vector<char> xs(size_t(R * C) * 2, 0), ws(size_t(V * C) * 2, 0);
  std::vector<float> dw(size_t(V * C), 0.0f), dx(size_t(R * C), 0.0f);
  const Tensor X = view_of(xs.data(), DType::bf16, Shape{R, C});
  const Tensor W = view_of(ws.data(), DType::bf16, Shape{V, C});
  const Tensor DW = view_of(dw.data(), Shape{V, C}), DX = view_of(dx.data(), Shape{R, C});
  for (const int64_t T : {512, 1024, 2048}) {
    std::vector<float> l(size_t(R * T), 0.0f);
    std::vector<char> g(size_t(R * T) * 2, 0);
    // fn(v0, t) over the tiles of every chunk.
    const auto tiles = [&](auto&& fn) {
      for (int64_t r0 = 0; r0 < N; r0 += R)
        for (int64_t v0 = 0; v0 < V; v0 += T) fn(v0, std::min(T, V - v0));
    };
    const double lm = median_ms(reps, [&] {
      tiles([&](int64_t v0, int64_t t) {
        kernels::matmul(X, W.rows(v0, t), view_of(l.data(), Shape{R, t}), R, t, C, false, true);
      });
    });
    const double wm = median_ms(reps, [&] {
      tiles([&](int64_t v0, int64_t t) {
        kernels::matmul(view_of(g.data(), DType::bf16, Shape{R, t}), X, DW.rows(v0, t), t, C, R,
                        true, false, 1.0f, 1.0f);
      });
    });
    const double xm = median_ms(reps, [&] {
      tiles([&](int64_t v0, int64_t t) {
        kernels::matmul(view_of(g.data(), DType::bf16, Shape{R, t}), W.rows(v0, t), DX, R, C, t,
                        false, false, 1.0f, v0 == 0 ? 0.0f : 1.0f);
      });
    });
    const double all = 2 * lm + wm + xm, f = 3 * 2.0 * double(N) * double(V) * double(C);
    std::printf("| %lld | %.3f | %.3f | %.3f | %.3f | %.0f%% |\n", (long long)T, lm, wm, xm, all,
                100 * f / (all * 1e-3) / p16);
  }
  return 0;
}
