// Throughput of the CUDA backend's GEMMs and attention at GPT-2-small and ~1B Llama shapes.
//
//   tessera-cuda-bench [--json FILE] [--peak-tflops P] [--reps N]
//
// GEMMs: every linear layer's forward (Y = X W), data gradient (dX = dY W^T) and weight
// gradient (dW = X^T dY) for 8192 tokens, in fp32 (cuBLAS, no TF32) and bf16 (fp32
// accumulation, bf16 C); each is reported in TFLOP/s and as a fraction of P, the device's
// dense bf16 peak (default 989 TFLOP/s, the H100/H200 SXM datasheet figure). "layer+head" is the
// FLOP-weighted aggregate of a model's GEMMs, the number an MFU estimate would use.
// Attention: causal forward and backward in fp32, FLOPs counted as FlashAttention does
// (forward 4 B Hq T^2 D / 2, backward 2.5x that), whatever the kernel recomputes.
// Times are medians over N repetitions (default 10) after 3 warm-ups, measured with CUDA events.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/context.hpp"
#include "kernels/kernels.hpp"

namespace {

namespace cuda = tessera::kernels::cuda;
namespace kernels = tessera::kernels;
using tessera::Charge;
using tessera::DType;
using tessera::Shape;
using tessera::Space;
using tessera::Tensor;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

struct Options {
  std::string json;
  double peak = 989.0;
  int reps = 10;
};

// A device buffer from the context's pool holding pseudo-random floats (a 4M-float random block
// repeated: random enough that tensor cores are not timed on trivial data).
class Buffer {
 public:
  Buffer(cuda::Context& ctx, size_t n, DType dtype) : ctx_(ctx), n_(n), dtype_(dtype) {
    p_ = ctx.pool().allocate(std::max<size_t>(n, 1) * (dtype == DType::f32 ? 4 : 2),
                             Charge::activations);
  }
  ~Buffer() { ctx_.pool().release(p_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* f32() const { return static_cast<float*>(p_); }
  void* get() const { return p_; }
  Tensor view() const { return tessera::view_of(p_, dtype_, Shape{int64_t(n_)}, Space::cuda); }

  void randomize(const Buffer* scratch_f32 = nullptr) {
    static const std::vector<float> block = [] {
      std::vector<float> b(size_t(1) << 22);
      std::mt19937 gen(1);
      std::normal_distribution<float> dist(0.0f, 1.0f);
      for (float& x : b) x = dist(gen);
      return b;
    }();
    float* dst = dtype_ == DType::f32 ? f32() : scratch_f32->f32();
    for (size_t off = 0; off < n_; off += block.size())
      check(cudaMemcpyAsync(dst + off, block.data(), std::min(block.size(), n_ - off) * 4,
                            cudaMemcpyHostToDevice, ctx_.stream()),
            "cudaMemcpyAsync");
    if (dtype_ == DType::bf16)
      kernels::cast(tessera::view_of(dst, Shape{int64_t(n_)}, Space::cuda), view(), int64_t(n_));
    ctx_.synchronize();
  }

 private:
  cuda::Context& ctx_;
  void* p_ = nullptr;
  size_t n_;
  DType dtype_;
};

// Median milliseconds of f() over reps runs after 3 warm-ups.
template <class F>
double time_ms(cuda::Context& ctx, int reps, F&& f) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(a, ctx.stream()), "cudaEventRecord");
    f();
    check(cudaEventRecord(b, ctx.stream()), "cudaEventRecord");
    check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float t = 0;
    check(cudaEventElapsedTime(&t, a, b), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Linear {
  const char* name;
  int64_t in, out;  // W is [in, out]
};
struct Model {
  const char* name;
  int64_t tokens;
  std::vector<Linear> linears;
  // attention
  int64_t B, T, Hq, Hkv, D;
};

std::vector<Model> models() {
  return {
      {"gpt2-small",
       8192,
       {{"qkv", 768, 2304},
        {"attn_out", 768, 768},
        {"mlp_up", 768, 3072},
        {"mlp_down", 3072, 768},
        {"lm_head", 768, 50304}},
       8,
       1024,
       12,
       12,
       64},
      {"llama-1b",
       8192,
       {{"qkv", 2048, 3072},
        {"attn_out", 2048, 2048},
        {"gate_up", 2048, 16384},
        {"down", 8192, 2048},
        {"lm_head", 2048, 128256}},
       4,
       2048,
       32,
       8,
       64},
  };
}

struct Record {
  std::string model, kind, name, dtype;
  int64_t M = 0, N = 0, K = 0;
  double ms = 0, flop = 0;
  double tflops() const { return flop / (ms * 1e-3) / 1e12; }
};

// Y[M,N] = op(A) op(B) for the three orientations of one linear layer.
struct Gemm {
  const char* pass;
  int64_t M, N, K;
  bool ta, tb;
};
std::vector<Gemm> passes(int64_t T, const Linear& l) {
  return {{"fwd", T, l.out, l.in, false, false},    // Y = X W
          {"dgrad", T, l.in, l.out, false, true},   // dX = dY W^T
          {"wgrad", l.in, l.out, T, true, false}};  // dW = X^T dY
}

void bench_gemms(cuda::Context& ctx, const Model& m, const Options& o, std::vector<Record>& out) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const char* dname = dt == DType::f32 ? "fp32" : "bf16";
    double total_flop = 0, total_ms = 0;
    for (const Linear& l : m.linears)
      for (const Gemm& g : passes(m.tokens, l)) {
        Buffer A(ctx, size_t(g.M * g.K), dt), B(ctx, size_t(g.K * g.N), dt),
            C(ctx, size_t(g.M * g.N), dt);
        {
          Buffer scratch(ctx, size_t(std::max(g.M * g.K, g.K * g.N)), DType::f32);
          A.randomize(&scratch);
          B.randomize(&scratch);
        }
        const double ms = time_ms(ctx, o.reps, [&] {
          kernels::matmul(A.view(), B.view(), C.view(), g.M, g.N, g.K, g.ta, g.tb);
        });
        Record r{m.name, "gemm", std::string(l.name) + "." + g.pass,           dname, g.M, g.N,
                 g.K,    ms,     2.0 * double(g.M) * double(g.N) * double(g.K)};
        total_flop += r.flop;
        total_ms += ms;
        std::printf("  %-10s %-5s %-16s %6lld x %6lld x %6lld  %9.3f ms  %7.1f TFLOP/s  %5.1f%%\n",
                    m.name, dname, r.name.c_str(), (long long)g.M, (long long)g.N, (long long)g.K,
                    ms, r.tflops(), 100.0 * r.tflops() / o.peak);
        std::fflush(stdout);
        out.push_back(r);
      }
    Record agg{m.name, "gemm", "layer+head", dname, 0, 0, 0, total_ms, total_flop};
    std::printf("  %-10s %-5s %-16s %26s  %9.3f ms  %7.1f TFLOP/s  %5.1f%%\n", m.name, dname,
                "layer+head", "", total_ms, agg.tflops(), 100.0 * agg.tflops() / o.peak);
    out.push_back(agg);
  }
}

void bench_attention(cuda::Context& ctx, const Model& m, const Options& o,
                     std::vector<Record>& out) {
  const tessera::kernels::AttnShape s{m.B,   m.T, m.Hq,
                                      m.Hkv, m.D, float(1.0 / std::sqrt(double(m.D)))};
  const size_t nq = size_t(m.B * m.T * m.Hq * m.D), nkv = size_t(m.B * m.T * m.Hkv * m.D);
  Buffer q(ctx, nq, DType::f32), k(ctx, nkv, DType::f32), v(ctx, nkv, DType::f32),
      dout(ctx, nq, DType::f32), o_(ctx, nq, DType::f32),
      lse(ctx, size_t(m.B * m.Hq * m.T), DType::f32), dq(ctx, nq, DType::f32),
      dk(ctx, nkv, DType::f32), dv(ctx, nkv, DType::f32);
  for (Buffer* b : {&q, &k, &v, &dout}) b->randomize();
  const double fwd_flop = 4.0 * m.B * m.Hq * double(m.T) * m.T * m.D / 2;
  const double fwd = time_ms(ctx, o.reps, [&] {
    kernels::attention_forward(q.view(), k.view(), v.view(), o_.view(), lse.view(), s);
  });
  const double bwd = time_ms(ctx, o.reps, [&] {
    kernels::attention_backward(dout.view(), q.view(), k.view(), v.view(), o_.view(), lse.view(),
                                dq.view(), dk.view(), dv.view(), s);
  });
  const Record rf{m.name, "attention", "fwd", "fp32", m.T, m.Hq, m.D, fwd, fwd_flop};
  const Record rb{m.name, "attention", "bwd", "fp32", m.T, m.Hq, m.D, bwd, 2.5 * fwd_flop};
  for (const Record& r : {rf, rb}) {
    std::printf(
        "  %-10s %-5s attention.%-6s B%lld T%lld Hq%lld Hkv%lld D%lld  %9.3f ms  %7.1f TFLOP/s\n",
        m.name, "fp32", r.name.c_str(), (long long)m.B, (long long)m.T, (long long)m.Hq,
        (long long)m.Hkv, (long long)m.D, r.ms, r.tflops());
    out.push_back(r);
  }
}

void write_json(const std::string& path, const std::vector<Record>& rs, const Options& o,
                const char* device) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
  std::fprintf(f,
               "{\"impl\": \"tessera\", \"device\": \"%s\", \"peak_tflops\": %g, \"records\": [\n",
               device, o.peak);
  for (size_t i = 0; i < rs.size(); ++i) {
    const Record& r = rs[i];
    std::fprintf(f,
                 "  {\"model\": \"%s\", \"kind\": \"%s\", \"name\": \"%s\", \"dtype\": \"%s\", "
                 "\"M\": %lld, \"N\": %lld, \"K\": %lld, \"ms\": %.5f, \"tflops\": %.3f}%s\n",
                 r.model.c_str(), r.kind.c_str(), r.name.c_str(), r.dtype.c_str(), (long long)r.M,
                 (long long)r.N, (long long)r.K, r.ms, r.tflops(), i + 1 < rs.size() ? "," : "");
  }
  std::fprintf(f, "]}\n");
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc)
      o.json = argv[++i];
    else if (a == "--peak-tflops" && i + 1 < argc)
      o.peak = std::atof(argv[++i]);
    else if (a == "--reps" && i + 1 < argc)
      o.reps = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: %s [--json FILE] [--peak-tflops P] [--reps N]\n", argv[0]);
      return 2;
    }
  }
  if (cuda::device_count() == 0) {
    std::printf("no CUDA device: nothing to measure\n");
    return 0;
  }
  cuda::Context ctx(0);
  cuda::ContextScope scope(ctx);
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device: %s, %d SMs; TFLOP/s %% of %.0f (dense bf16 peak)\n", prop.name,
              prop.multiProcessorCount, o.peak);
  std::vector<Record> records;
  for (const Model& m : models()) {
    bench_gemms(ctx, m, o, records);
    bench_attention(ctx, m, o, records);
  }
  std::printf("device memory: %.2f GB reserved at most\n", ctx.pool().peak_reserved() / 1e9);
  if (!o.json.empty()) write_json(o.json, records, o, prop.name);
  return 0;
}
