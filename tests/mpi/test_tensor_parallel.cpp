// Tensor parallelism (Megatron-LM column/row splits, vocabulary-parallel embedding and
// cross-entropy, sequence parallelism) against the serial layers, under mpiexec.
//
// MPI_COMM_WORLD is split into consecutive groups of t ranks for t in {1, 2, 4}; ranks left
// over (a world not divisible by t) skip the case. On every rank of a group each test builds
//   * the serial layer: the whole model shape, its own ParamStore, a size-1 tp communicator;
//   * the TP layer: cfg.split({t, rank, sp}), its own ParamStore, the group's communicator;
// initialises both from the same seed (a split parameter must hold exactly its block of the
// serial one: checked bit for bit), runs forward and backward on the same inputs (with
// sequence parallelism each rank feeds rows [rank*N/t, (rank+1)*N/t) of the residual stream)
// and compares outputs, input gradients and every parameter gradient block with the serial
// ones, to kRtol times the largest magnitude of the serial tensor. Gradients that are partial
// over the tp ranks (norm weights and biases under sequence parallelism) are all-reduced over
// the group first, as Transformer::backward does.
//
// The tp communicator's traffic (calls and bytes, counting rules in comm/communicator.hpp)
// is asserted around each layer's forward and backward; see "Expected traffic" below.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/process_grid.hpp"
#include "core/error.hpp"
#include "model/attention.hpp"
#include "model/block.hpp"
#include "model/config.hpp"
#include "model/embedding.hpp"
#include "model/linear.hpp"
#include "model/mlp.hpp"
#include "model/output_head.hpp"
#include "model/param.hpp"
#include "model/step_context.hpp"
#include "model/tensor_parallel.hpp"
#include "model/transformer.hpp"
#include "../test_vectors.hpp"

namespace tessera {
namespace {

using test::FVec;
using test::randn;

constexpr int64_t kB = 2;       // sequences per micro-batch
constexpr double kRtol = 1e-5;  // |tp - serial| <= kRtol * max |serial| over the whole tensor

// ---- inputs ------------------------------------------------------------------------------


// Ids in [0, vocab), including the first and the last valid id and a repeated one.
std::vector<int32_t> token_ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, int32_t(vocab) - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = dist(gen);
  ids[0] = int32_t(vocab) - 1;
  ids[1] = 0;
  ids[5] = ids[2];
  return ids;
}

// Rows [first, first + R) of a row-major [*, C] array.
FVec rows_of(const FVec& a, int64_t C, int64_t first, int64_t R) {
  return FVec(a.begin() + first * C, a.begin() + (first + R) * C);
}

// a as a [rows, cols] tensor (the layers' activations and gradients).
Tensor mat(const FVec& a, int64_t rows, int64_t cols) {
  return view_of(a.data(), {rows, cols});
}

// The values of a layer's [rows, C] output, which must have that shape.
FVec values(const Tensor& t, int64_t rows, int64_t C) {
  EXPECT_EQ(t.shape.str(), Shape({rows, C}).str());
  return FVec(t.f32(), t.f32() + t.numel());
}

// Columns [c0, c0 + w) of a row-major [N, W] array.
FVec cols_of(const FVec& a, int64_t N, int64_t W, int64_t c0, int64_t w) {
  FVec out(static_cast<size_t>(N * w));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < w; ++c) out[size_t(n * w + c)] = a[size_t(n * W + c0 + c)];
  return out;
}

double max_abs(const float* a, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, double(std::abs(a[i])));
  return m;
}

// ---- comparisons -------------------------------------------------------------------------

// Elements i < n with |got[i] - want(i)| > rtol * scale (NaN counts); the first few are
// reported as failures unless quiet.
int64_t mismatches(const std::string& what, const float* got, int64_t n,
                   const std::function<double(int64_t)>& want, double scale, double rtol,
                   bool quiet = false) {
  const double tol = rtol * scale;
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double w = want(i), g = got[i];
    if (std::abs(g - w) <= tol) continue;
    if (++bad <= 5 && !quiet)
      ADD_FAILURE() << what << "[" << i << "]: tensor-parallel " << g << ", serial " << w
                    << " (difference " << std::abs(g - w) << " > " << tol << ")";
  }
  return bad;
}

// got[R*C] against rows [first, first + R) of the serial full[N*C].
void expect_rows(const std::string& what, const FVec& got, const FVec& full, int64_t C,
                 int64_t first) {
  const double scale = max_abs(full.data(), int64_t(full.size()));
  EXPECT_GT(scale, 0.0) << what;
  EXPECT_EQ(mismatches(
                what, got.data(), int64_t(got.size()),
                [&](int64_t i) { return full[size_t(first * C + i)]; }, scale, kRtol),
            0)
      << what << " (rows from " << first << ")";
}

// Element i of p's block is element global_index(p, i) of the whole tensor (the mapping of
// ParamStore::initialize); `index` replaces the block index (the self-test's wrong block).
int64_t global_index(const Param& p, int64_t i, int64_t index) {
  if (!p.tp.split()) return i;
  const int d = p.tp.dim;
  int64_t inner = 1;
  for (int k = d + 1; k < p.global.ndim; ++k) inner *= p.global[k];
  const int64_t block = p.local[d] * inner, whole = p.global[d] * inner;
  return (i / block) * whole + index * block + i % block;
}

enum class Field { value, grad };

// Elements of the TP store's parameters that differ from the serial store's: values must be
// identical bits, gradients within rtol of the serial tensor's largest magnitude. Also checks
// that both stores hold the same names and that each local shape is the global one split.
// wrong_block: compare split parameters with block (index + 1) % parts instead (self-test).
int64_t param_mismatches(ParamStore& tp, ParamStore& serial, Field field, bool quiet = false,
                         bool wrong_block = false) {
  int64_t bad = 0;
  if (!quiet) EXPECT_EQ(tp.params().size(), serial.params().size());
  // The key bias's gradient is zero in exact arithmetic (softmax ignores a constant added to
  // a row of scores), so it holds only rounding noise: it is measured against the largest
  // gradient of the whole serial store instead of its own.
  double store_max = 0;
  for (Param* q : serial.params())
    store_max = std::max(store_max, max_abs(q->grad.f32(), q->global.numel()));
  for (Param* p : tp.params()) {
    const Param* q = serial.find(p->name);
    if (q == nullptr) {
      ADD_FAILURE() << "serial store has no " << p->name;
      ++bad;
      continue;
    }
    if (!quiet) {
      EXPECT_TRUE(p->global == q->global)
          << p->name << " " << p->global.str() << " vs " << q->global.str();
      Shape expect = q->global;
      if (p->tp.split()) expect.dims[size_t(p->tp.dim)] /= p->tp.parts;
      EXPECT_TRUE(p->local == expect) << p->name << " " << p->local.str();
    }
    const int64_t index = wrong_block ? (p->tp.index + 1) % p->tp.parts : p->tp.index;
    const float* ref = field == Field::value ? q->value.f32() : q->grad.f32();
    const float* got = field == Field::value ? p->value.f32() : p->grad.f32();
    const double scale = field == Field::value
                             ? 0.0
                             : std::max(max_abs(ref, q->global.numel()),
                                        p->name.ends_with(".k.bias") ? store_max : 0.0);
    bad += mismatches(
        p->name + (field == Field::value ? " value" : " grad"), got, p->local.numel(),
        [&](int64_t i) { return ref[global_index(*p, i, index)]; }, scale,
        field == Field::value ? 0.0 : kRtol, quiet);
  }
  return bad;
}

void expect_param_grads(ParamStore& tp, ParamStore& serial) {
  EXPECT_EQ(param_mismatches(tp, serial, Field::grad), 0) << "parameter gradients";
}

// ---- parameters --------------------------------------------------------------------------

uint64_t mix64(uint64_t z) {  // splitmix64's finaliser
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// In [-0.5, 0.5), a pure function of (name, global index) like the initialisation itself.
float pseudo(const std::string& name, int64_t g) {
  const uint64_t h = mix64(std::hash<std::string>{}(name) ^ mix64(uint64_t(g)));
  return float(double(h >> 11) * 0x1.0p-53) - 0.5f;
}

// After ParamStore::initialize: norm weights (1) and biases (0) are moved off those values so
// a bias added twice or a weight forgotten shows, and the padding rows of vocabulary tables
// are set to 5 (they must never matter). Same global element, same value, on every layout.
void perturb(ParamStore& store) {
  for (Param* p : store.params()) {
    const bool table = p->init.valid_rows >= 0;
    if (p->init.kind == ParamInit::normal && !table) continue;
    float* v = p->value.f32();
    const int64_t row = p->global.numel() / p->global[0];
    for (int64_t i = 0; i < p->local.numel(); ++i) {
      const int64_t g = global_index(*p, i, p->tp.index);
      if (!table)
        v[i] += 0.6f * pseudo(p->name, g);
      else if (g >= p->init.valid_rows * row)
        v[i] = 5.0f;
    }
  }
}

// Lays out and initialises the serial and the TP store from one seed, checks that every TP
// parameter is bit for bit its block of the serial one (padding rows included), then perturbs
// both (perturb) and zeroes their gradients. Further serial stores (extra) get the same.
void init_pair(ParamStore& serial, ParamStore& tp, Allocator& alloc, uint64_t seed,
               std::vector<ParamStore*> extra = {}) {
  extra.push_back(&serial);
  extra.push_back(&tp);
  for (ParamStore* s : extra) {
    s->finalize(alloc);
    s->initialize(seed);
  }
  EXPECT_EQ(param_mismatches(tp, serial, Field::value), 0) << "initial parameter values";
  for (ParamStore* s : extra) {
    perturb(*s);
    s->zero_grads();
  }
  EXPECT_EQ(param_mismatches(tp, serial, Field::value), 0) << "perturbed parameter values";
}

// ---- the world split into tensor-parallel groups -----------------------------------------

Communicator tp_group(int t) {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm c;
  MPI_Comm_split(MPI_COMM_WORLD, r / t, r % t, &c);
  return Communicator(c, "tp");
}

// Both sides of a comparison: the serial context (size-1 tp) and the TP one (this rank's
// group of t). Construct on every rank (the split is collective), then skip if !active().
struct TpEnv {
  TpEnv(int t_, bool sp_) : t(t_), sp(sp_), self(MPI_COMM_SELF, "self"), tp(tp_group(t_)) {}
  bool active() const { return tp.size() == t; }
  TensorParallel split() const { return {t, tp.rank(), sp}; }
  StepContext serial_ctx(bool training = true) {
    return StepContext{alloc, serial_par, serial_scratch, 0, kB, training, 1.0f};
  }
  StepContext tp_ctx(bool training = true) {
    return StepContext{alloc, tp_par, tp_scratch, 0, kB, training, 1.0f};
  }
  // Sums the gradients that are partial over the tp ranks, as Transformer::backward does.
  void reduce_partial_grads(ParamStore& store) {
    for (Param* p : store.params())
      if (p->tp_partial_grad) tp.all_reduce(p->grad.f32(), p->local.numel());
  }
  TrafficStats traffic() const { return tp.stats(); }

  int t;
  bool sp;
  Communicator self, tp;
  ParallelContext serial_par{self, self, false};
  ParallelContext tp_par{self, tp, sp};
  Allocator alloc;
  Scratch serial_scratch{alloc}, tp_scratch{alloc};
};

// ---- model shapes ------------------------------------------------------------------------

// Divisible by t = 4 everywhere (heads, key/value heads, MLP width, padded vocabulary, the
// N = 16 tokens for sequence parallelism). llama has grouped-query attention at every t: 4
// heads on 2 key/value heads (t <= 2), 8 on 4 (t = 4: one key/value head and two query
// heads per rank); gpt2 has 4 heads on 4 (t = 4: one of each per rank). The vocabulary 253
// is padded to 256: at t = 2 and 4 the last rank holds 3 padding rows.
ModelConfig model_config(Arch arch, int t, int64_t vocab = 253) {
  ModelConfig c;
  c.arch = arch;
  c.layers = 2;
  c.d_model = 32;
  c.heads = arch == Arch::llama && t == 4 ? 8 : 4;
  c.kv_heads = arch == Arch::llama ? c.heads / 2 : c.heads;
  c.head_dim = c.d_model / c.heads;
  c.ffn_hidden = 48;
  c.vocab = vocab;
  c.vocab_padded = 256;
  c.seq_len = 8;
  c.norm_eps = 1e-5f;
  c.rope_theta = 100.0f;
  c.init_std = 0.2f;
  c.tie_embeddings = arch == Arch::gpt2;
  return c;
}

// ---- expected traffic --------------------------------------------------------------------
//
// Megatron-LM (doc/parallelism.md; seed 002, sections 五 and 七): a block does 2 all-reduces forward
// (the row-parallel outputs of attention and MLP) and 2 backward (the gradients of the
// column-parallel inputs of attention and MLP), each of the N x C residual stream. With
// sequence parallelism each all-reduce becomes a reduce-scatter + all-gather pair, the same
// volume on the wire ((t-1)/t * 4NC each half); forward: all-gather of the normed input before
// each sublayer + reduce-scatter of its output; backward: all-gather of dy and of the
// re-gathered normed input (only this rank's rows are kept) per sublayer + reduce-scatter of
// the input gradient. The counters (comm/communicator.hpp) count what this rank puts in:
// all_reduce n*4 (n*8 for doubles), reduce_scatter the whole input N*C*4, all_gather its own
// block N/t*C*4; a size-1 communicator counts nothing. With M = N*C*4 bytes:
//   block forward    no SP: 2 calls, 2M          SP: 2 AG + 2 RS = 4 calls, 2M/t + 2M
//   block backward   no SP: 2 calls, 2M          SP: 4 AG + 2 RS = 6 calls, 4M/t + 2M
//   embedding fwd    1 all-reduce or 1 reduce-scatter of the partial lookup: 1 call, M
//   embedding bwd    no SP: nothing              SP: 1 AG of dx: 1 call, M/t
//   head forward     row max (N floats), sum of exps (N doubles), target logit (N floats):
//                    3 calls, 16N bytes; SP: + 1 AG of the normed input (M/t); training:
//                    + the gradient of the normed input, all-reduce or RS: 1 call, M
//   head backward    nothing (the final norm's backward is local)
//   partial grads    SP only, after each part's backward (Transformer): one all-reduce of C
//                    floats per norm weight/bias (llama 2 per block + 1, gpt2 4 + 2)
struct Traffic {
  int64_t calls = 0, bytes = 0;
  Traffic operator+(const Traffic& o) const { return {calls + o.calls, bytes + o.bytes}; }
  bool operator==(const Traffic& o) const = default;
};

std::ostream& operator<<(std::ostream& os, const Traffic& t) {
  return os << t.calls << " calls, " << t.bytes << " bytes";
}

Traffic delta(const TrafficStats& before, const TrafficStats& after) {
  return {after.calls - before.calls, after.bytes - before.bytes};
}

struct Expected {
  int64_t t, N, C;
  bool sp;
  int64_t M() const { return N * C * 4; }
  bool none() const { return t == 1; }
  Traffic block_forward() const {
    if (none()) return {};
    return sp ? Traffic{4, 2 * M() / t + 2 * M()} : Traffic{2, 2 * M()};
  }
  Traffic block_backward() const {
    if (none()) return {};
    return sp ? Traffic{6, 4 * M() / t + 2 * M()} : Traffic{2, 2 * M()};
  }
  Traffic embedding_forward() const { return none() ? Traffic{} : Traffic{1, M()}; }
  Traffic embedding_backward() const { return none() || !sp ? Traffic{} : Traffic{1, M() / t}; }
  Traffic head_forward(bool training) const {
    if (none()) return {};
    Traffic r{3, 4 * N + 8 * N + 4 * N};
    if (sp) r = r + Traffic{1, M() / t};
    if (training) r = r + Traffic{1, M()};
    return r;
  }
  // The partial-gradient all-reduces of `count` norm parameters of C floats.
  Traffic partial_grads(int64_t count) const {
    return none() || !sp ? Traffic{} : Traffic{count, count * C * 4};
  }
};

// ---- test parameters ---------------------------------------------------------------------

struct Case {
  int t;
  Arch arch;
  bool sp;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return "t" + std::to_string(info.param.t) + "_" +
         (info.param.arch == Arch::llama ? "llama" : "gpt2") + (info.param.sp ? "_sp" : "");
}

// t in {1, 2, 4}, both architectures, with and without sequence parallelism (not at t = 1,
// where it does nothing).
std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (int t : {1, 2, 4})
    for (Arch arch : {Arch::llama, Arch::gpt2})
      for (bool sp : {false, true})
        if (t > 1 || !sp) out.push_back({t, arch, sp});
  return out;
}

#define TP_SKIP_UNLESS_ACTIVE(env)                                                             \
  if (!(env).active())                                                                         \
  GTEST_SKIP() << "tp = " << (env).t << " does not fit this rank's group (" << (env).tp.size() \
               << " ranks)"

// ---- Linear ------------------------------------------------------------------------------

struct LinearCase {
  int t;
  Split split;
  bool bias;
};

class TensorParallelLinear : public ::testing::TestWithParam<LinearCase> {};

// Column-parallel: x whole, y's columns of this rank; dx partial (summed here over tp).
// Row-parallel: x's columns of this rank, y partial (summed here, bias added after the sum);
// dx its columns.
TEST_P(TensorParallelLinear, MatchesSerial) {
  const LinearCase c = GetParam();
  TpEnv env(c.t, false);
  TP_SKIP_UNLESS_ACTIVE(env);
  const int64_t N = 12, in = 16, out = 24, t = c.t, r = env.tp.rank();
  ParamStore ss, ps;
  const Linear serial(ss, "lin", in, out, c.bias, 0.3f);
  const Linear tpl(ps, "lin", in, out, c.bias, 0.3f, c.split, t, r);
  init_pair(ss, ps, env.alloc, 5);
  StepContext sctx = env.serial_ctx(), pctx = env.tp_ctx();
  if (c.bias) ASSERT_NE(ps.find("lin.bias"), nullptr);

  const FVec x = randn(N * in, 1), dy = randn(N * out, 2);
  FVec y(N * out), dx(N * in, 123.0f);
  serial.forward(sctx, mat(x, N, in), mat(y, N, out));
  serial.backward(sctx, mat(x, N, in), mat(dy, N, out), mat(dx, N, in));

  const TrafficStats before = env.traffic();
  if (c.split == Split::column) {
    const int64_t w = out / t;
    EXPECT_EQ(tpl.out(), w);
    EXPECT_EQ(tpl.in(), in);
    FVec yp(N * w), dxp(N * in, 123.0f);
    tpl.forward(pctx, mat(x, N, in), mat(yp, N, w));
    const FVec dyp = cols_of(dy, N, out, r * w, w);
    tpl.backward(pctx, mat(x, N, in), mat(dyp, N, w), mat(dxp, N, in));
    env.tp.all_reduce(dxp.data(), N * in);  // the input gradient is a partial sum
    const FVec y_block = cols_of(y, N, out, r * w, w);
    expect_rows("y", yp, y_block, w, 0);
    expect_rows("dx", dxp, dx, in, 0);
  } else {
    const int64_t w = in / t;
    EXPECT_EQ(tpl.in(), w);
    EXPECT_EQ(tpl.out(), out);
    const FVec xp = cols_of(x, N, in, r * w, w);
    FVec yp(N * out), dxp(N * w, 123.0f);
    tpl.forward(pctx, mat(xp, N, w), mat(yp, N, out));
    env.tp.all_reduce(yp.data(), N * out);  // the output is a partial sum
    if (t > 1) tpl.add_bias(mat(yp, N, out));  // once, after the sum
    tpl.backward(pctx, mat(xp, N, w), mat(dy, N, out), mat(dxp, N, w));
    expect_rows("y", yp, y, out, 0);
    expect_rows("dx", dxp, cols_of(dx, N, in, r * w, w), w, 0);
  }
  // Only the test's own all-reduce: the linear map itself never communicates.
  const int64_t reduced = N * (c.split == Split::column ? in : out);
  EXPECT_EQ(delta(before, env.traffic()), (t == 1 ? Traffic{} : Traffic{1, reduced * 4}));
  expect_param_grads(ps, ss);
}

std::vector<LinearCase> linear_cases() {
  std::vector<LinearCase> out;
  for (int t : {1, 2, 4})
    for (Split s : {Split::column, Split::row})
      for (bool bias : {false, true}) out.push_back({t, s, bias});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Tp, TensorParallelLinear, ::testing::ValuesIn(linear_cases()),
                         [](const ::testing::TestParamInfo<LinearCase>& i) {
                           return "t" + std::to_string(i.param.t) +
                                  (i.param.split == Split::column ? "_column" : "_row") +
                                  (i.param.bias ? "_bias" : "");
                         });

// ---- Attention and Mlp: sublayers that add onto the residual stream -----------------------

// forward(ctx, x[N,C], y[rows,C]) adds onto y; backward(ctx, x, dy[N,C], dx[rows,C]).
template <class Layer>
void check_sublayer(const Case& c, const char* name, uint32_t seed) {
  TpEnv env(c.t, c.sp);
  TP_SKIP_UNLESS_ACTIVE(env);
  const ModelConfig scfg = model_config(c.arch, c.t);
  ModelConfig pcfg = scfg;
  pcfg.split(env.split());
  ParamStore ss, ps;
  Layer serial(ss, name, scfg), tpl(ps, name, pcfg);
  init_pair(ss, ps, env.alloc, seed);

  StepContext sctx = env.serial_ctx(), pctx = env.tp_ctx();
  const int64_t N = kB * scfg.seq_len, C = scfg.d_model;
  const int64_t R = tp::rows(pctx, N), first = tp::first_row(pctx, N);
  EXPECT_EQ(R, c.sp && c.t > 1 ? N / c.t : N);
  const FVec x = randn(N * C, seed + 1), y0 = randn(N * C, seed + 2), dy = randn(N * C, seed + 3);

  FVec y = y0, dx(N * C, 123.0f);
  serial.forward(sctx, mat(x, N, C), mat(y, N, C));
  serial.backward(sctx, mat(x, N, C), mat(dy, N, C), mat(dx, N, C));

  const FVec y0p = rows_of(y0, C, first, R);
  FVec yp = y0p, dxp(R * C, 123.0f);
  const TrafficStats t0 = env.traffic();
  tpl.forward(pctx, mat(x, N, C), mat(yp, R, C));
  const TrafficStats t1 = env.traffic();
  tpl.backward(pctx, mat(x, N, C), mat(dy, N, C), mat(dxp, R, C));
  const TrafficStats t2 = env.traffic();

  // The sublayer's own contribution, y - y0, so the residual does not hide it.
  FVec delta_s(N * C), delta_p(R * C);
  for (int64_t i = 0; i < N * C; ++i) delta_s[size_t(i)] = y[size_t(i)] - y0[size_t(i)];
  for (int64_t i = 0; i < R * C; ++i) delta_p[size_t(i)] = yp[size_t(i)] - y0p[size_t(i)];
  expect_rows("y - y0", delta_p, delta_s, C, first);
  expect_rows("dx", dxp, dx, C, first);
  expect_param_grads(ps, ss);
  for (Param* p : ps.params()) EXPECT_FALSE(p->tp_partial_grad) << p->name;

  // One all-reduce (or with SP one reduce-scatter) of N x C each way; with SP the gathers of
  // the input and of dy belong to the Block.
  const Expected e{c.t, N, C, c.sp};
  const Traffic one = e.none() ? Traffic{} : Traffic{1, e.M()};
  EXPECT_EQ(delta(t0, t1), one) << "forward";
  EXPECT_EQ(delta(t1, t2), one) << "backward";
}

class TensorParallelAttention : public ::testing::TestWithParam<Case> {};
TEST_P(TensorParallelAttention, MatchesSerial) {
  check_sublayer<Attention>(GetParam(), "attn", 21);
}
INSTANTIATE_TEST_SUITE_P(Tp, TensorParallelAttention, ::testing::ValuesIn(all_cases()), case_name);

class TensorParallelMlp : public ::testing::TestWithParam<Case> {};
TEST_P(TensorParallelMlp, MatchesSerial) {
  check_sublayer<Mlp>(GetParam(), "mlp", 31);
}
INSTANTIATE_TEST_SUITE_P(Tp, TensorParallelMlp, ::testing::ValuesIn(all_cases()), case_name);

// ---- Block -------------------------------------------------------------------------------

class TensorParallelBlock : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelBlock, MatchesSerialAndCountsCollectives) {
  const Case c = GetParam();
  TpEnv env(c.t, c.sp);
  TP_SKIP_UNLESS_ACTIVE(env);
  const ModelConfig scfg = model_config(c.arch, c.t);
  ModelConfig pcfg = scfg;
  pcfg.split(env.split());
  ParamStore ss, ps;
  Block serial(ss, "layers.0", scfg), tpl(ps, "layers.0", pcfg);
  init_pair(ss, ps, env.alloc, 41);
  // Only the norms' parameters are partial over tp, and only with sequence parallelism.
  for (Param* p : ps.params())
    EXPECT_EQ(p->tp_partial_grad, c.sp && c.t > 1 && p->name.find("_norm.") != std::string::npos)
        << p->name;

  StepContext sctx = env.serial_ctx(), pctx = env.tp_ctx();
  const int64_t N = kB * scfg.seq_len, C = scfg.d_model;
  const int64_t R = tp::rows(pctx, N), first = tp::first_row(pctx, N);
  FVec x = randn(N * C, 42);
  for (float& v : x) v += 0.5f;  // a non-zero row mean for LayerNorm
  const FVec dy = randn(N * C, 43);

  const FVec y = values(serial.forward(sctx, mat(x, N, C)), N, C);
  FVec dx(N * C, 123.0f);
  serial.backward(sctx, mat(dy, N, C), mat(dx, N, C));

  const FVec xp = rows_of(x, C, first, R), dyp = rows_of(dy, C, first, R);
  FVec dxp(R * C, 123.0f);
  const TrafficStats t0 = env.traffic();
  const Tensor op = tpl.forward(pctx, mat(xp, R, C));
  const TrafficStats t1 = env.traffic();
  const FVec yp = values(op, R, C);
  tpl.backward(pctx, mat(dyp, R, C), mat(dxp, R, C));
  const TrafficStats t2 = env.traffic();
  env.reduce_partial_grads(ps);

  expect_rows("y", yp, y, C, first);
  expect_rows("dx", dxp, dx, C, first);
  expect_param_grads(ps, ss);

  const Expected e{c.t, N, C, c.sp};
  EXPECT_EQ(delta(t0, t1), e.block_forward()) << "forward";
  EXPECT_EQ(delta(t1, t2), e.block_backward()) << "backward";
  if (c.t == 2 && !c.sp) {  // the plain numbers, N = 16, C = 32
    EXPECT_EQ(delta(t0, t1), (Traffic{2, 2 * 16 * 32 * 4}));
    EXPECT_EQ(delta(t1, t2), (Traffic{2, 2 * 16 * 32 * 4}));
  }
}

INSTANTIATE_TEST_SUITE_P(Tp, TensorParallelBlock, ::testing::ValuesIn(all_cases()), case_name);

// ---- Embedding ---------------------------------------------------------------------------

struct VocabCase {
  Case c;
  int64_t vocab;  // padded to 256
};

std::vector<VocabCase> vocab_cases() {
  std::vector<VocabCase> out;
  // 253: 3 padding rows on the last rank; 130: at t = 4 ranks 2 and 3 hold only padding rows
  // (vocab_multiple = 128 with tp = 4).
  for (const Case& c : all_cases())
    for (int64_t v : {253, 130}) out.push_back({c, v});
  return out;
}

std::string vocab_case_name(const ::testing::TestParamInfo<VocabCase>& info) {
  return case_name({info.param.c, info.index}) + "_vocab" + std::to_string(info.param.vocab);
}

// Gradient rows of vocabulary-table padding (global row >= vocab) held by this rank: all 0.
void expect_zero_padding_grads(ParamStore& store, const std::string& name, int64_t vocab) {
  const Param* p = store.find(name);
  ASSERT_NE(p, nullptr) << name;
  const int64_t C = p->global[1];
  int64_t nonzero = 0, seen = 0;
  for (int64_t i = 0; i < p->local.numel(); ++i)
    if (global_index(*p, i, p->tp.index) >= vocab * C) {
      ++seen;
      nonzero += p->grad.f32()[i] != 0.0f;
    }
  EXPECT_EQ(nonzero, 0) << name << ": " << nonzero << " of " << seen << " padding elements";
}

class TensorParallelEmbedding : public ::testing::TestWithParam<VocabCase> {};

TEST_P(TensorParallelEmbedding, VocabParallelMatchesSerial) {
  const Case c = GetParam().c;
  const int64_t vocab = GetParam().vocab;
  TpEnv env(c.t, c.sp);
  TP_SKIP_UNLESS_ACTIVE(env);
  const ModelConfig scfg = model_config(c.arch, c.t, vocab);
  ModelConfig pcfg = scfg;
  pcfg.split(env.split());
  ParamStore ss, ps;
  Embedding serial(ss, scfg), tpl(ps, pcfg);
  init_pair(ss, ps, env.alloc, 51);
  EXPECT_EQ(tpl.token_table().local[0], 256 / c.t);

  StepContext sctx = env.serial_ctx(), pctx = env.tp_ctx();
  const int64_t N = kB * scfg.seq_len, C = scfg.d_model;
  const int64_t R = tp::rows(pctx, N), first = tp::first_row(pctx, N);
  const std::vector<int32_t> ids = token_ids(N, vocab, 52);
  const FVec dx = randn(N * C, 53);

  const Tensor tids = view_of(ids.data(), {kB, scfg.seq_len});
  const FVec x = values(serial.forward(sctx, tids), N, C);
  serial.backward(sctx, mat(dx, N, C));

  const TrafficStats t0 = env.traffic();
  const Tensor op = tpl.forward(pctx, tids);
  const TrafficStats t1 = env.traffic();
  const FVec xp = values(op, R, C);
  const FVec dxp = rows_of(dx, C, first, R);
  tpl.backward(pctx, mat(dxp, R, C));
  const TrafficStats t2 = env.traffic();

  expect_rows("x", xp, x, C, first);
  expect_param_grads(ps, ss);
  expect_zero_padding_grads(ps, "embed.tok.weight", vocab);

  const Expected e{c.t, N, C, c.sp};
  EXPECT_EQ(delta(t0, t1), e.embedding_forward()) << "forward";
  EXPECT_EQ(delta(t1, t2), e.embedding_backward()) << "backward";
}

INSTANTIATE_TEST_SUITE_P(Tp, TensorParallelEmbedding, ::testing::ValuesIn(vocab_cases()),
                         vocab_case_name);

// ---- OutputHead --------------------------------------------------------------------------

// The head with its weight: its own (llama) or the embedding table (gpt2, tied).
struct Head {
  Head(ParamStore& store, const ModelConfig& cfg) {
    if (cfg.tie_embeddings) embed = std::make_unique<Embedding>(store, cfg);
    head = std::make_unique<OutputHead>(store, cfg, embed ? &embed->token_table() : nullptr);
  }
  std::unique_ptr<Embedding> embed;
  std::unique_ptr<OutputHead> head;
};

class TensorParallelOutputHead : public ::testing::TestWithParam<VocabCase> {};

// Vocabulary-parallel cross-entropy: the loss (summed over all N tokens, the same on every tp
// rank), the gradient of the head's input and of the weight's blocks match the serial head;
// and a vocabulary padded for tp leaves the loss unchanged: it equals the loss of a serial
// head without padding rows (whose padding rows here hold 5, not 0).
TEST_P(TensorParallelOutputHead, VocabParallelCrossEntropyMatchesSerial) {
  const Case c = GetParam().c;
  const int64_t vocab = GetParam().vocab;
  TpEnv env(c.t, c.sp);
  TP_SKIP_UNLESS_ACTIVE(env);
  const ModelConfig scfg = model_config(c.arch, c.t, vocab);
  ModelConfig ucfg = scfg;  // serial, unpadded
  ucfg.vocab_padded = vocab;
  ModelConfig pcfg = scfg;
  pcfg.split(env.split());
  ParamStore ss, us, ps;
  Head serial(ss, scfg), unpadded(us, ucfg), tpl(ps, pcfg);
  init_pair(ss, ps, env.alloc, 61, {&us});
  const std::string wname = c.arch == Arch::gpt2 ? "embed.tok.weight" : "head.weight";
  ASSERT_NE(ps.find(wname), nullptr);

  const int64_t N = kB * scfg.seq_len, C = scfg.d_model;
  StepContext sctx = env.serial_ctx(), pctx = env.tp_ctx();
  sctx.loss_scale = pctx.loss_scale = 1.0f / float(N);
  const int64_t R = tp::rows(pctx, N), first = tp::first_row(pctx, N);
  const FVec x = randn(N * C, 62);
  const std::vector<int32_t> targets = token_ids(N, vocab, 63);
  const Tensor tt = view_of(targets.data(), {kB, scfg.seq_len});

  const double L = serial.head->forward(sctx, mat(x, N, C), tt);
  FVec dx(N * C, 123.0f);
  serial.head->backward(sctx, mat(dx, N, C));
  // The unpadded serial head (its own scratch: it must not share buffers with the padded one).
  Scratch uscratch(env.alloc);
  StepContext uctx{env.alloc, env.serial_par, uscratch, 0, kB, true, 1.0f / float(N)};
  const double Lu = unpadded.head->forward(uctx, mat(x, N, C), tt);

  const FVec xp = rows_of(x, C, first, R);
  FVec dxp(R * C, 123.0f);
  const TrafficStats t0 = env.traffic();
  const double Lp = tpl.head->forward(pctx, mat(xp, R, C), tt);
  const TrafficStats t1 = env.traffic();
  tpl.head->backward(pctx, mat(dxp, R, C));
  const TrafficStats t2 = env.traffic();
  env.reduce_partial_grads(ps);

  ASSERT_TRUE(std::isfinite(L));
  EXPECT_NEAR(Lu, L, kRtol * std::abs(L)) << "padding rows changed the serial loss";
  EXPECT_NEAR(Lp, L, kRtol * std::abs(L)) << "tensor-parallel loss";
  EXPECT_NEAR(Lp, Lu, kRtol * std::abs(L)) << "tensor-parallel loss vs the unpadded vocabulary";
  double lo = Lp, hi = Lp;  // every rank of the group returns the same loss
  env.tp.all_reduce(&lo, 1, ReduceOp::min);
  env.tp.all_reduce(&hi, 1, ReduceOp::max);
  EXPECT_LE(hi - lo, 1e-12 * std::abs(L));
  expect_rows("dx", dxp, dx, C, first);
  expect_param_grads(ps, ss);
  expect_zero_padding_grads(ps, wname, vocab);

  const Expected e{c.t, N, C, c.sp};
  EXPECT_EQ(delta(t0, t1), e.head_forward(true)) << "forward";
  EXPECT_EQ(delta(t1, t2), Traffic{}) << "backward";
  if (c.t == 2 && !c.sp)  // 3 all-reduces of N numbers (4N + 8N + 4N bytes) + dxn (N*C*4)
    EXPECT_EQ(delta(t0, t1), (Traffic{4, 16 * 16 + 16 * 32 * 4}));

  // Evaluation: the same loss, no gradient all-reduce.
  StepContext ectx = env.tp_ctx(false);
  ectx.loss_scale = 1.0f / float(N);
  const TrafficStats t3 = env.traffic();
  const double Le = tpl.head->forward(ectx, mat(xp, R, C), tt);
  EXPECT_EQ(delta(t3, env.traffic()), e.head_forward(false)) << "evaluation forward";
  EXPECT_NEAR(Le, Lp, 1e-12 * std::abs(Lp));
}

INSTANTIATE_TEST_SUITE_P(Tp, TensorParallelOutputHead, ::testing::ValuesIn(vocab_cases()),
                         vocab_case_name);

// ---- the whole model ---------------------------------------------------------------------

// Records the tp traffic of every (part, pass) window of the Transformer (PartHooks::begin
// to end: for backward that includes the partial-gradient all-reduces).
class TrafficRecorder : public PartHooks {
 public:
  explicit TrafficRecorder(const Communicator& c) : comm_(c) {}
  void begin(int, Pass, bool) override { start_ = comm_.stats(); }
  void end(int part, Pass pass, bool) override {
    log_.push_back({part, pass, delta(start_, comm_.stats())});
  }
  struct Entry {
    int part;
    Pass pass;
    Traffic traffic;
  };
  const std::vector<Entry>& log() const { return log_; }

 private:
  const Communicator& comm_;
  TrafficStats start_;
  std::vector<Entry> log_;
};

class TensorParallelTransformer : public ::testing::TestWithParam<Case> {};

// Loss and every parameter gradient of a 2-layer model through Transformer::forward/backward
// (which sums the partial norm gradients itself), and the traffic of each part's passes.
TEST_P(TensorParallelTransformer, MatchesSerial) {
  const Case c = GetParam();
  TpEnv env(c.t, c.sp);
  TP_SKIP_UNLESS_ACTIVE(env);
  const ModelConfig scfg = model_config(c.arch, c.t);
  ModelConfig pcfg = scfg;
  pcfg.split(env.split());
  ParamStore ss, ps;
  Transformer serial(scfg, ss), tpm(pcfg, ps);
  init_pair(ss, ps, env.alloc, 71);

  const int64_t N = kB * scfg.seq_len, C = scfg.d_model;
  const std::vector<int32_t> ids = token_ids(N, scfg.vocab, 72),
                             targets = token_ids(N, scfg.vocab, 73);
  StepContext sctx = env.serial_ctx(), pctx = env.tp_ctx();
  sctx.loss_scale = pctx.loss_scale = 1.0f / float(N);
  TrafficRecorder rec(env.tp);
  pctx.hooks = &rec;

  const Tensor tids = view_of(ids.data(), {kB, scfg.seq_len});
  const Tensor tt = view_of(targets.data(), {kB, scfg.seq_len});
  const double L = serial.forward(sctx, tids, tt);
  serial.backward(sctx);
  const TrafficStats t0 = env.traffic();
  const double Lp = tpm.forward(pctx, tids, tt);
  tpm.backward(pctx);
  const TrafficStats t1 = env.traffic();

  ASSERT_TRUE(std::isfinite(L));
  EXPECT_NEAR(Lp, L, kRtol * std::abs(L));
  expect_param_grads(ps, ss);

  // Per part and pass, in order: embedding, blocks, head forward; head, blocks (last first),
  // embedding backward.
  const Expected e{c.t, N, C, c.sp};
  const int64_t layers = scfg.layers, head = layers + 1;
  const int64_t block_norm_params = c.arch == Arch::llama ? 2 : 4;
  const int64_t head_norm_params = c.arch == Arch::llama ? 1 : 2;
  std::vector<TrafficRecorder::Entry> want;
  want.push_back({0, Pass::forward, e.embedding_forward()});
  for (int l = 1; l <= layers; ++l) want.push_back({l, Pass::forward, e.block_forward()});
  want.push_back({int(head), Pass::forward, e.head_forward(true)});
  want.push_back({int(head), Pass::backward, e.partial_grads(head_norm_params)});
  for (int l = int(layers); l >= 1; --l)
    want.push_back({l, Pass::backward, e.block_backward() + e.partial_grads(block_norm_params)});
  want.push_back({0, Pass::backward, e.embedding_backward()});
  ASSERT_EQ(rec.log().size(), want.size());
  Traffic total;
  for (size_t i = 0; i < want.size(); ++i) {
    const auto& got = rec.log()[i];
    EXPECT_EQ(got.part, want[i].part) << i;
    EXPECT_EQ(got.pass, want[i].pass) << i;
    EXPECT_EQ(got.traffic, want[i].traffic)
        << "part " << got.part << (got.pass == Pass::forward ? " forward" : " backward");
    total = total + want[i].traffic;
  }
  EXPECT_EQ(delta(t0, t1), total) << "nothing outside the parts";
}

INSTANTIATE_TEST_SUITE_P(Tp, TensorParallelTransformer, ::testing::ValuesIn(all_cases()),
                         case_name);

// ---- the comparisons can fail ------------------------------------------------------------

// With t = 2 a column-parallel map's parameters and outputs compared against the other rank's
// block must mismatch (and against its own must not), so the checks above are not vacuous;
// a 1% error in one gradient element must be caught too.
TEST(TensorParallelSelfTest, WrongBlockIsCaught) {
  TpEnv env(2, false);
  TP_SKIP_UNLESS_ACTIVE(env);
  const int64_t N = 6, in = 8, out = 12, w = out / 2, r = env.tp.rank();
  ParamStore ss, ps;
  const Linear serial(ss, "lin", in, out, true, 0.3f);
  const Linear tpl(ps, "lin", in, out, true, 0.3f, Split::column, 2, r);
  init_pair(ss, ps, env.alloc, 81);
  StepContext sctx = env.serial_ctx(), pctx = env.tp_ctx();
  EXPECT_EQ(param_mismatches(ps, ss, Field::value, true), 0);
  EXPECT_GT(param_mismatches(ps, ss, Field::value, true, /*wrong_block=*/true), 0);

  const FVec x = randn(N * in, 82), dy = randn(N * out, 83);
  FVec y(N * out), dx(N * in), yp(N * w), dxp(N * in);
  serial.forward(sctx, mat(x, N, in), mat(y, N, out));
  serial.backward(sctx, mat(x, N, in), mat(dy, N, out), mat(dx, N, in));
  tpl.forward(pctx, mat(x, N, in), mat(yp, N, w));
  const FVec dyp = cols_of(dy, N, out, r * w, w);
  tpl.backward(pctx, mat(x, N, in), mat(dyp, N, w), mat(dxp, N, in));
  auto out_mismatches = [&](int64_t block) {
    const FVec want = cols_of(y, N, out, block * w, w);
    return mismatches(
        "y", yp.data(), N * w, [&](int64_t i) { return want[size_t(i)]; },
        max_abs(y.data(), N * out), kRtol, true);
  };
  EXPECT_EQ(out_mismatches(r), 0);
  EXPECT_GT(out_mismatches(1 - r), 0);
  EXPECT_EQ(param_mismatches(ps, ss, Field::grad, true), 0);
  EXPECT_GT(param_mismatches(ps, ss, Field::grad, true, /*wrong_block=*/true), 0);
  ps.find("lin.weight")->grad.f32()[3] *= 1.01f;
  EXPECT_EQ(param_mismatches(ps, ss, Field::grad, true), 1);
}

// ---- divisibility ------------------------------------------------------------------------

// ModelConfig::split names the dimension tp does not divide (a collective error: every rank
// has the same config).
TEST(TensorParallelConfig, SplitRejectsNonDivisors) {
  auto message = [](ModelConfig c, int64_t t) {
    try {
      c.split({t, 0, false});
    } catch (const Error& e) {
      EXPECT_TRUE(e.collective());
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const ModelConfig c = model_config(Arch::llama, 2);  // heads 4, kv_heads 2, F 48, V 256
  EXPECT_NE(message(c, 3).find("does not divide model.heads = 4"), std::string::npos);
  ModelConfig kv = c;
  kv.heads = 8;
  EXPECT_NE(message(kv, 4).find("does not divide model.kv_heads = 2"), std::string::npos);
  ModelConfig f = c;
  f.ffn_hidden = 51;
  EXPECT_NE(message(f, 2).find("does not divide the MLP width 51"), std::string::npos);
  ModelConfig v = c;
  v.vocab_padded = 255;
  EXPECT_NE(message(v, 2).find("does not divide the padded vocabulary 255"), std::string::npos);
  EXPECT_EQ(message(c, 2), "no error");
}

}  // namespace
}  // namespace tessera
