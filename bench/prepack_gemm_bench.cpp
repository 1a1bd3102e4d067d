// Would packing the weights before the GEMM pay? tessera's bf16 GEMMs go through oneDNN's
// matmul with plain row-major operands (src/kernels/cpu/gemm_dnnl.cpp); the bf16 micro-kernel
// needs B in a blocked (pairs of K interleaved) layout, so the primitive copies B inside every
// call. This benchmark times, for each GEMM of a step whose B is a weight (the forward
// y = x W^T and the input gradient dx = dy W) and for the 1536^3 GEMM MFU is measured
// against, at row counts M from 256 to 2048 (1536 for the square):
//
//   plain    the call tessera makes (strided B, copied inside the primitive)
//   packed   one reorder of B into the primitive's preferred layout, then the matmul on it
//            (the reorder is inside the timing: a weight changes every step)
//
// and checks that both give the same bits. doc/performance.md ("The MFU goal") reads it.
//
//   tessera-prepack-bench [--d-model C] [--ffn F] [--vocab V] [--reps R]
#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "timing.hpp"

namespace {

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

struct Shape {
  const char* name;
  int64_t N, K;
  bool tb;  // B stored [N, K] (the forward's W^T) or [K, N] (the input gradient's W)
  bool square = false;  // the 1536^3 GEMM: M = N = K only
};

uint16_t to_bf16(float x) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

struct Result {
  double plain_ms, packed_ms, reorder_ms;
  bool same;
};

Result run(dnnl::engine& eng, dnnl::stream& s, int64_t M, const Shape& sh, int reps) {
  const int64_t N = sh.N, K = sh.K;
  std::mt19937 gen(7);
  std::normal_distribution<float> normal;
  std::vector<uint16_t> a(size_t(M * K)), b(size_t(K * N));
  for (auto& x : a) x = to_bf16(normal(gen));
  for (auto& x : b) x = to_bf16(normal(gen));
  std::vector<float> c1(size_t(M * N)), c2(size_t(M * N));
  const dnnl::memory::desc ad({M, K}, dt::bf16, dims{K, 1});
  const dnnl::memory::desc bd({K, N}, dt::bf16, sh.tb ? dims{1, K} : dims{N, 1});
  const dnnl::memory::desc cd({M, N}, dt::f32, dims{N, 1});
  dnnl::memory am(ad, eng, a.data()), bm(bd, eng, b.data());
  dnnl::memory c1m(cd, eng, c1.data()), c2m(cd, eng, c2.data());

  const dnnl::matmul plain(dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), eng));
  const dnnl::memory::desc any({K, N}, dt::bf16, dnnl::memory::format_tag::any);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ad, any, cd), eng);
  const dnnl::matmul packed(pd);
  dnnl::memory bp(pd.weights_desc(), eng);
  const dnnl::reorder pack(bm, bp);

  Result r;
  r.plain_ms = tessera::bench::median_ms(reps, [&] {
    plain.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, c1m}});
    s.wait();
  });
  r.reorder_ms = tessera::bench::median_ms(reps, [&] {
    pack.execute(s, bm, bp);
    s.wait();
  });
  r.packed_ms = tessera::bench::median_ms(reps, [&] {
    pack.execute(s, bm, bp);
    packed.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bp}, {DNNL_ARG_DST, c2m}});
    s.wait();
  });
  r.same = std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)) == 0;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t C = 512, F = 2048, V = 50304;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const int64_t v = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--d-model")) C = v;
    else if (!std::strcmp(argv[i], "--ffn")) F = v;
    else if (!std::strcmp(argv[i], "--vocab")) V = v;
    else if (!std::strcmp(argv[i], "--reps")) reps = int(v);
  }
  const Shape shapes[] = {
      {"qkv forward", 3 * C, C, true}, {"qkv dx", C, 3 * C, false},
      {"proj forward", C, C, true},    {"proj dx", C, C, false},
      {"fc1 forward", F, C, true},     {"fc1 dx", C, F, false},
      {"fc2 forward", C, F, true},     {"fc2 dx", F, C, false},
      {"head logits", V, C, true},     {"head dx", C, V, false},
      {"1536^3 (peak)", 1536, 1536, false, true},
  };
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  std::printf("bf16 operands, fp32 output; median of %d; packed = reorder of B + matmul on it\n\n",
              reps);
  std::printf("| GEMM | N x K | M | plain ms | packed ms (reorder) | packed vs plain | same bits |\n");
  std::printf("|---|---|---:|---:|---:|---:|---|\n");
  for (const Shape& sh : shapes)
    for (const int64_t M : sh.square ? std::vector<int64_t>{sh.N}
                                     : std::vector<int64_t>{256, 512, 1024, 2048}) {
      const Result r = run(eng, s, M, sh, reps);
      std::printf("| %s | %lld x %lld | %lld | %.3f | %.3f (%.3f) | %+.1f%% | %s |\n", sh.name,
                  (long long)sh.N, (long long)sh.K, (long long)M, r.plain_ms, r.packed_ms,
                  r.reorder_ms, 100 * (r.plain_ms - r.packed_ms) / r.plain_ms,
                  r.same ? "yes" : "NO");
      std::fflush(stdout);
    }
  return 0;
}
