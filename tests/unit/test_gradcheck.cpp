// Finite-difference gradient checks of every layer in src/model/. Each case defines a scalar
// loss -- L = sum(output * R) for a fixed random R, or the summed token loss for the output
// head and the whole model -- and compares the layer's analytic gradients (of its inputs and
// of a sample of every parameter tensor's elements) with a fourth-order central difference
// of L. Values are initialised large (init_std 0.3, norm weights and biases perturbed away
// from 1 and 0) so that every term of a gradient carries weight.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/process_grid.hpp"
#include "config/run_config.hpp"
#include "model/attention.hpp"
#include "model/block.hpp"
#include "model/config.hpp"
#include "model/embedding.hpp"
#include "model/linear.hpp"
#include "model/mlp.hpp"
#include "model/moe.hpp"
#include "model/norm.hpp"
#include "model/output_head.hpp"
#include "model/param.hpp"
#include "model/step_context.hpp"
#include "model/transformer.hpp"
#include "mpi_environment.hpp"
#include "../test_vectors.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace tessera {
namespace {

using test::FVec;
using test::randn;

constexpr int64_t kB = 2;       // sequences per micro-batch
constexpr int kSamples = 20;    // elements checked per parameter tensor
constexpr double kStep = 1e-2;  // finite-difference step (values are of order 1)
constexpr double kRtol = 2e-2;  // |fd - an| <= kRtol * max(|fd|, |an|) + kAtol
constexpr double kAtol = 1e-3;

// v as a [rows, cols] tensor (the layers' activations and gradients).
Tensor mat(const FVec& v, int64_t rows, int64_t cols) {
  return view_of(v.data(), {rows, cols});
}

double dot(const float* a, const FVec& r) {
  double s = 0;
  for (size_t i = 0; i < r.size(); ++i) s += double(a[i]) * r[i];
  return s;
}
double dot(const Tensor& a, const FVec& r) {
  EXPECT_EQ(a.numel(), int64_t(r.size()));
  return dot(a.f32(), r);
}

// The loss evaluations of the finite differences run on one thread: thousands of tiny
// parallel regions are slow on a loaded machine, and the analytic backward (which runs with
// the default threads) is what the check is about.
class SingleThread {
 public:
#ifdef _OPENMP
  SingleThread() : saved_(omp_get_max_threads()) {
    omp_set_num_threads(1);
  }
  ~SingleThread() {
    omp_set_num_threads(saved_);
  }

 private:
  int saved_;
#endif
};

// Compares analytic gradients with finite differences of a loss; counts (and unless quiet,
// reports) every element outside the tolerance.
class GradChecker {
 public:
  GradChecker(std::function<double()> loss, uint32_t seed, bool quiet = false)
      : loss_(std::move(loss)), gen_(seed), quiet_(quiet) {}

  // dL/dx[i] by the fourth-order stencil (8 (L(+h) - L(-h)) - (L(+2h) - L(-2h))) / 12h.
  // x[i] is perturbed in place (it is what the loss reads) and restored.
  double finite_difference(float* x) {
    const float x0 = *x;
    auto at = [&](double k) {
      *x = float(double(x0) + k * kStep);
      return loss_();
    };
    const double d1 = at(1) - at(-1), d2 = at(2) - at(-2);
    *x = x0;
    return (8 * d1 - d2) / (12 * kStep);
  }

  // Checks `samples` random elements of x[n] (all of them when n <= samples, or samples < 0).
  void check(const std::string& what, float* x, int64_t n, const float* analytic,
             int samples = kSamples) {
    SingleThread one_thread;
    std::vector<int64_t> idx(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) idx[i] = i;
    if (samples >= 0 && n > samples) {
      std::shuffle(idx.begin(), idx.end(), gen_);
      idx.resize(size_t(samples));
    }
    for (int64_t i : idx) {
      const double fd = finite_difference(x + i), an = analytic[i];
      const double err = std::abs(fd - an),
                   bound = kRtol * std::max(std::abs(fd), std::abs(an)) + kAtol;
      ++checked_;
      worst_ = std::max(worst_, err / bound);
      if (err > bound) {
        ++failed_;
        if (!quiet_ && failed_ <= 10)
          ADD_FAILURE() << what << "[" << i << "]: finite difference " << fd << ", analytic " << an
                        << " (error " << err << " > " << bound << ")";
      }
    }
  }

  // Every parameter tensor of the store; grads is a copy of store.grads() after backward.
  void check_params(ParamStore& store, const FVec& grads, int samples = kSamples) {
    for (Param* p : store.params())
      check(p->name, p->value.f32(), p->global.numel(), grads.data() + p->offset, samples);
  }

  int checked() const { return checked_; }
  int failed() const { return failed_; }
  double worst() const { return worst_; }  // largest error / bound seen

 private:
  std::function<double()> loss_;
  std::mt19937 gen_;
  bool quiet_;
  int checked_ = 0, failed_ = 0;
  double worst_ = 0;
};

// After ParamStore::initialize: norm weights (init 1) and biases (init 0) are moved away from
// those values so that a gradient that forgets a w or b factor is caught.
void perturb_constant_params(ParamStore& store, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 0.3f);
  for (Param* p : store.params()) {
    if (p->init.kind == ParamInit::normal) continue;
    float* v = p->value.f32();
    for (int64_t i = 0; i < p->global.numel(); ++i) v[i] += dist(gen);
  }
}

// The number of elements check_params(store, samples) checks.
int64_t planned_checks(ParamStore& store, int samples = kSamples) {
  int64_t n = 0;
  for (const Param* p : store.params())
    n += samples < 0 ? p->global.numel() : std::min<int64_t>(samples, p->global.numel());
  return n;
}

FVec copy_grads(const ParamStore& store) {
  return FVec(store.grads(), store.grads() + store.numel());
}

ModelConfig tiny_config(Arch arch) {
  ModelConfig c;
  c.arch = arch;
  c.layers = 2;
  c.d_model = 16;
  c.heads = 4;
  c.kv_heads = arch == Arch::llama ? 2 : 4;  // GQA for llama
  c.head_dim = c.d_model / c.heads;
  c.ffn_hidden = 24;
  c.vocab = 11;
  c.vocab_padded = 16;  // 5 padding rows
  c.seq_len = 6;
  c.norm_eps = 1e-5f;
  c.rope_theta = 100.0f;  // with D = 4 the second pair turns by 0.1 rad per position
  c.init_std = 0.3f;
  c.tie_embeddings = arch == Arch::gpt2;
  return c;
}

class GradCheck : public ::testing::Test {
 public:  // the check_* helpers below use these
  static void SetUpTestSuite() { test::require_mpi(); }

  // Parameters are in place: finalize, initialize, perturb, zero the gradients.
  void finish_store(ParamStore& store, uint32_t seed = 7) {
    store.finalize(alloc_);
    store.initialize(seed);
    perturb_constant_params(store, seed + 1);
    store.zero_grads();
  }
  StepContext context(bool training, int64_t batch = kB) {
    return StepContext{alloc_, par_, scratch_, 0, batch, training, 1.0f};
  }
  // Every check passed, and as many were made as planned.
  static void expect_all_pass(const GradChecker& chk, int64_t planned) {
    EXPECT_EQ(chk.failed(), 0) << chk.failed() << " of " << chk.checked() << " failed";
    EXPECT_EQ(chk.checked(), planned);
    // How close the worst element came to its bound (in the XML report).
    ::testing::Test::RecordProperty("worst_error_over_bound", std::to_string(chk.worst()));
  }

  Allocator alloc_;
  Communicator comm_{MPI_COMM_SELF, "self"};
  ParallelContext par_{comm_, comm_};
  Scratch scratch_{alloc_};
  StepContext sc_{alloc_, par_, scratch_};  // for the layers that take one (Linear)
};

// ---- Linear ------------------------------------------------------------------------------

TEST_F(GradCheck, Linear) {
  for (bool bias : {false, true}) {
    SCOPED_TRACE(bias ? "with bias" : "without bias");
    const int64_t N = 10, in = 7, out = 5;
    ParamStore store;
    Linear lin(store, "lin", in, out, bias, 0.3f);
    finish_store(store);
    FVec x = randn(N * in, 1), R = randn(N * out, 2), y(N * out);
    auto loss = [&] {
      lin.forward(sc_, mat(x, N, in), mat(y, N, out));
      return dot(y.data(), R);
    };
    FVec dx(N * in, 123.0f);  // overwritten
    lin.backward(sc_, mat(x, N, in), mat(R, N, out), mat(dx, N, in));
    const FVec grads = copy_grads(store);
    GradChecker chk(loss, 3);
    chk.check("x", x.data(), N * in, dx.data(), -1);
    chk.check_params(store, grads, -1);
    expect_all_pass(chk, N * in + planned_checks(store, -1));
  }
}

TEST_F(GradCheck, LinearAccumulateFlags) {
  const int64_t N = 3, in = 4, out = 2;
  ParamStore store;
  Linear lin(store, "lin", in, out, true, 0.3f);
  finish_store(store);
  const FVec x = randn(N * in, 4), dy = randn(N * out, 5);
  FVec y(N * out), y_acc = randn(N * out, 6);
  const FVec y0 = y_acc;
  lin.forward(sc_, mat(x, N, in), mat(y, N, out));
  lin.forward(sc_, mat(x, N, in), mat(y_acc, N, out), /*accumulate=*/true);
  for (int64_t i = 0; i < N * out; ++i) EXPECT_NEAR(y_acc[i], y0[i] + y[i], 1e-6) << i;

  FVec dx(N * in), dx_acc = randn(N * in, 7);
  const FVec dx0 = dx_acc;
  lin.backward(sc_, mat(x, N, in), mat(dy, N, out), mat(dx, N, in));
  const FVec g1 = copy_grads(store);
  lin.backward(sc_, mat(x, N, in), mat(dy, N, out), mat(dx_acc, N, in), /*accumulate_dx=*/true);
  for (int64_t i = 0; i < N * in; ++i) EXPECT_NEAR(dx_acc[i], dx0[i] + dx[i], 1e-6) << i;
  // Parameter gradients accumulate over calls; dx may be empty.
  lin.backward(sc_, mat(x, N, in), mat(dy, N, out), Tensor{});
  for (int64_t i = 0; i < store.numel(); ++i) EXPECT_NEAR(store.grads()[i], 3 * g1[i], 1e-5);
}

// Sizes come from the activations' shapes, so an activation of the wrong shape is an error
// rather than a read with the wrong sizes.
TEST_F(GradCheck, LayersRejectActivationsOfTheWrongShape) {
  const int64_t N = 3, in = 4, out = 2;
  ParamStore store;
  Linear lin(store, "lin", in, out, true, 0.3f);
  Norm norm(store, "norm", in, /*layernorm=*/true, 1e-5f);
  finish_store(store);
  const FVec x = randn(N * in, 8);
  FVec y(N * out), n(N * in), stats(2 * N);
  EXPECT_THROW(lin.forward(sc_, view_of(x.data(), {N * in}), mat(y, N, out)), std::logic_error);
  EXPECT_THROW(lin.forward(sc_, mat(x, N * 2, in / 2), mat(y, N, out)), std::logic_error);
  EXPECT_THROW(lin.backward(sc_, mat(x, N, in), mat(y, N * 2, out / 2), Tensor{}), std::logic_error);
  const Tensor mean = view_of(stats.data(), {N}), rstd = view_of(stats.data() + N, {N});
  EXPECT_THROW(norm.forward(mat(x, N * 2, in / 2), mat(n, N * 2, in / 2), mean, rstd),
               std::logic_error);
  EXPECT_NO_THROW(norm.forward(mat(x, N, in), mat(n, N, in), mean, rstd));
  EXPECT_NO_THROW(lin.forward(sc_, mat(n, N, in), mat(y, N, out)));
}

// ---- Norm --------------------------------------------------------------------------------

TEST_F(GradCheck, Norm) {
  for (bool layernorm : {false, true}) {
    SCOPED_TRACE(layernorm ? "LayerNorm" : "RMSNorm");
    const int64_t N = 10, C = 12;
    ParamStore store;
    Norm norm(store, "norm", C, layernorm, 1e-5f);
    finish_store(store);
    FVec x = randn(N * C, 11), R = randn(N * C, 12), y(N * C), mean(N), rstd(N);
    for (int64_t i = 0; i < N * C; ++i) x[i] += 0.5f;  // a non-zero mean for LayerNorm
    auto loss = [&] {
      norm.forward(mat(x, N, C), mat(y, N, C), view_of(mean.data(), {N}),
                   view_of(rstd.data(), {N}));
      return dot(y.data(), R);
    };
    loss();
    FVec dx(N * C, 123.0f);
    norm.backward(mat(x, N, C), mat(R, N, C), view_of(mean.data(), {N}), view_of(rstd.data(), {N}),
                  mat(dx, N, C));
    const FVec grads = copy_grads(store);
    GradChecker chk(loss, 13);
    chk.check("x", x.data(), N * C, dx.data(), -1);
    chk.check_params(store, grads, -1);
    expect_all_pass(chk, N * C + planned_checks(store, -1));
  }
}

// ---- Attention, Mlp, Block: layers that add onto a residual stream y -----------------------

// forward(ctx, x, y) adds onto y; backward(ctx, x, dy, dx) overwrites dx.
template <class Layer>
void check_residual_sublayer(Layer& layer, ParamStore& store, StepContext& ctx,
                             const ModelConfig& cfg, uint32_t seed) {
  const int64_t N = ctx.batch * cfg.seq_len, C = cfg.d_model;
  FVec x = randn(N * C, seed), R = randn(N * C, seed + 1), y(N * C);
  auto loss = [&] {
    std::fill(y.begin(), y.end(), 0.0f);
    ctx.training = false;
    layer.forward(ctx, mat(x, N, C), mat(y, N, C));
    return dot(y.data(), R);
  };
  ctx.training = true;
  std::fill(y.begin(), y.end(), 0.0f);
  layer.forward(ctx, mat(x, N, C), mat(y, N, C));
  FVec dx(N * C, 123.0f);
  layer.backward(ctx, mat(x, N, C), mat(R, N, C), mat(dx, N, C));
  const FVec grads = copy_grads(store);
  GradChecker chk(loss, seed + 2);
  chk.check("x", x.data(), N * C, dx.data(), -1);
  chk.check_params(store, grads);
  EXPECT_EQ(chk.failed(), 0) << chk.failed() << " of " << chk.checked() << " failed";
  EXPECT_EQ(chk.checked(), N * C + planned_checks(store));
  ::testing::Test::RecordProperty("worst_error_over_bound", std::to_string(chk.worst()));
}

TEST_F(GradCheck, AttentionLlamaRopeGqa) {
  ModelConfig cfg = tiny_config(Arch::llama);
  ASSERT_EQ(cfg.heads / cfg.kv_heads, 2);
  ParamStore store;
  Attention attn(store, "attn", cfg);
  finish_store(store);
  StepContext ctx = context(true);
  check_residual_sublayer(attn, store, ctx, cfg, 21);
}

TEST_F(GradCheck, AttentionGpt2WithBiases) {
  ModelConfig cfg = tiny_config(Arch::gpt2);
  cfg.heads = cfg.kv_heads = 2;
  cfg.head_dim = 8;
  ParamStore store;
  Attention attn(store, "attn", cfg);
  finish_store(store);
  ASSERT_NE(store.find("attn.q.bias"), nullptr);
  StepContext ctx = context(true);
  check_residual_sublayer(attn, store, ctx, cfg, 22);
}

TEST_F(GradCheck, MlpSwiglu) {
  const ModelConfig cfg = tiny_config(Arch::llama);
  ParamStore store;
  Mlp mlp(store, "mlp", cfg);
  finish_store(store);
  ASSERT_NE(store.find("mlp.gate.weight"), nullptr);
  StepContext ctx = context(true);
  check_residual_sublayer(mlp, store, ctx, cfg, 23);
}

TEST_F(GradCheck, MlpGelu) {
  const ModelConfig cfg = tiny_config(Arch::gpt2);
  ParamStore store;
  Mlp mlp(store, "mlp", cfg);
  finish_store(store);
  ASSERT_NE(store.find("mlp.up.bias"), nullptr);
  StepContext ctx = context(true);
  check_residual_sublayer(mlp, store, ctx, cfg, 24);
}

// Finite differences of L = sum(block(x) * R) against the block's backward, for x and every
// parameter. between runs after the training forward, before backward.
void check_block(GradCheck& t, Block& block, ParamStore& store, const ModelConfig& cfg,
                 uint32_t seed, const std::function<void()>& between = {}) {
  StepContext ctx = t.context(true);
  const int64_t N = kB * cfg.seq_len, C = cfg.d_model;
  FVec x = randn(N * C, seed), R = randn(N * C, seed + 1);
  auto loss = [&] {
    ctx.training = false;
    return dot(block.forward(ctx, mat(x, N, C)), R);
  };
  ctx.training = true;
  block.forward(ctx, mat(x, N, C));
  if (between) between();
  FVec dx(N * C, 123.0f);
  block.backward(ctx, mat(R, N, C), mat(dx, N, C));
  const FVec grads = copy_grads(store);
  GradChecker chk(loss, seed + 2);
  chk.check("x", x.data(), N * C, dx.data(), -1);
  chk.check_params(store, grads);
  GradCheck::expect_all_pass(chk, N * C + planned_checks(store));
}

TEST_F(GradCheck, BlockLlama) {
  const ModelConfig cfg = tiny_config(Arch::llama);
  ParamStore store;
  Block block(store, "layers.0", cfg);
  finish_store(store);
  check_block(*this, block, store, cfg, 31);
}

TEST_F(GradCheck, BlockGpt2) {
  const ModelConfig cfg = tiny_config(Arch::gpt2);
  ParamStore store;
  Block block(store, "layers.0", cfg);
  finish_store(store);
  check_block(*this, block, store, cfg, 34);
}

// A mixture-of-experts block (model/moe.cpp): the loss adds the balancing and z-loss terms
// the backward differentiates (ctx.loss_scale = 1: coefficient x T per sequence's balancing
// loss, coefficient per token's z^2), read from the layer's statistics of the forward.
void check_moe_block(GradCheck& t, ModelConfig cfg, uint32_t seed) {
  cfg.moe.top_k = 2, cfg.moe.ffn = 12;
  cfg.layers = 1;
  ParamStore store;
  Block block(store, "layers.0", cfg, Recompute::none, nullptr, true);
  t.finish_store(store, seed);
  ASSERT_NE(block.moe(), nullptr);
  ASSERT_NE(store.find("layers.0.moe.experts.3.up.weight"), nullptr);
  Communicator& self = t.comm_;
  StepContext ctx = t.context(true);
  const int64_t N = kB * cfg.seq_len, C = cfg.d_model, T = cfg.seq_len;
  FVec x = randn(N * C, seed), R = randn(N * C, seed + 1);
  auto objective = [&] {
    const double out = dot(block.forward(ctx, mat(x, N, C)), R);
    const Moe::Stats& s = block.moe()->end_step(self, false);
    return out + double(cfg.moe.aux_loss) * double(T) * s.aux + double(cfg.moe.z_loss) * s.z;
  };
  block.forward(ctx, mat(x, N, C));
  FVec dx(N * C, 123.0f);
  block.backward(ctx, mat(R, N, C), mat(dx, N, C));
  const FVec grads = copy_grads(store);
  block.moe()->end_step(self, false);  // the statistics start from this point
  GradChecker chk(objective, seed + 2);
  chk.check("x", x.data(), N * C, dx.data(), -1);
  // The selection bias only selects (a step function of the loss): not trained, gradient 0.
  const std::string bias = "layers.0.moe.router.selection_bias";
  int64_t planned = N * C;
  for (Param* p : store.params()) {
    if (p->name == bias) {
      for (int64_t e = 0; e < cfg.moe.experts; ++e) EXPECT_EQ(grads[size_t(p->offset + e)], 0.0f);
      continue;
    }
    chk.check(p->name, p->value.f32(), p->global.numel(), grads.data() + p->offset);
    planned += std::min<int64_t>(kSamples, p->global.numel());
  }
  GradCheck::expect_all_pass(chk, planned);
}

TEST_F(GradCheck, BlockMoeLlamaSigmoidShared) {
  ModelConfig cfg = tiny_config(Arch::llama);
  cfg.moe.experts = 4, cfg.moe.shared = 1, cfg.moe.router = Router::sigmoid;
  cfg.moe.aux_loss = 0.5f, cfg.moe.z_loss = 0.1f;
  check_moe_block(*this, cfg, 51);
}

TEST_F(GradCheck, BlockMoeGpt2SoftmaxCapacity) {
  ModelConfig cfg = tiny_config(Arch::gpt2);
  cfg.moe.experts = 4, cfg.moe.router = Router::softmax;
  cfg.moe.aux_loss = 0.5f, cfg.moe.capacity_factor = 1.0f;  // 3 of a sequence's 12 choices
  check_moe_block(*this, cfg, 54);
}

// Blocks that rebuild activations in backward (doc/recompute.md): selective reruns the
// attention core and the MLP activation, full the whole forward from the kept input.
TEST_F(GradCheck, BlockRecompute) {
  for (Arch arch : {Arch::llama, Arch::gpt2})
    for (Recompute mode : {Recompute::selective, Recompute::full}) {
      SCOPED_TRACE(std::string(to_string(arch)) + " " + to_string(mode));
      const ModelConfig cfg = tiny_config(arch);
      ParamStore store;
      Block::Rebuilt shared;
      Block block(store, "layers.0", cfg, mode, &shared);
      finish_store(store);
      // Overwrite what a rebuilt block must not rely on keeping: backward rebuilds it.
      check_block(*this, block, store, cfg, 34, [&] {
        for (Buffer* b : {&shared.attn.att, &shared.attn.lse, &shared.mlp.act})
          std::fill(b->view().f32(), b->view().f32() + b->numel(), 1e3f);
      });
    }
}

// ---- Embedding ---------------------------------------------------------------------------

std::vector<int32_t> token_ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, int32_t(vocab) - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = dist(gen);
  return ids;
}

TEST_F(GradCheck, Embedding) {
  for (Arch arch : {Arch::llama, Arch::gpt2}) {
    const ModelConfig cfg = tiny_config(arch);
    SCOPED_TRACE(cfg.arch_name());
    ParamStore store;
    Embedding embed(store, cfg);
    finish_store(store);
    StepContext ctx = context(true);
    const int64_t N = kB * cfg.seq_len, C = cfg.d_model;
    std::vector<int32_t> ids = token_ids(N, cfg.vocab, 41);
    ids[3] = ids[0] = ids[7];  // repeated ids accumulate
    const FVec R = randn(N * C, 42);
    auto loss = [&] { return dot(embed.forward(ctx, view_of(ids.data(), {kB, cfg.seq_len})), R); };
    loss();
    embed.backward(ctx, mat(R, N, C));
    const FVec grads = copy_grads(store);
    GradChecker chk(loss, 43);
    chk.check_params(store, grads, -1);  // every element, padding rows included
    expect_all_pass(chk, planned_checks(store, -1));
    // Rows never looked up (padding rows among them) have an exactly zero gradient.
    const Param& tok = embed.token_table();
    for (int64_t v = 0; v < cfg.vocab_padded; ++v) {
      if (std::find(ids.begin(), ids.end(), int32_t(v)) != ids.end()) continue;
      for (int64_t c = 0; c < C; ++c) ASSERT_EQ(grads[tok.offset + v * C + c], 0.0f) << v;
    }
  }
}

// ---- OutputHead --------------------------------------------------------------------------

// Whole rows of logits, and vocabulary tiles of 4 of the 11 real columns (the last tile 3 wide;
// ModelConfig::head_vocab_tile): the tiled head recomputes each tile's logits for its gradient.
TEST_F(GradCheck, OutputHead) {
  for (const int64_t tile : {0, 4})
  for (bool tied : {false, true}) {
    ModelConfig cfg = tiny_config(tied ? Arch::gpt2 : Arch::llama);
    cfg.head_vocab_tile = tile;
    ASSERT_EQ(cfg.head_tile_cols(), tile);
    SCOPED_TRACE(std::string(tied ? "gpt2, tied to the embedding" : "llama, own head") +
                 (tile ? ", vocabulary tiles" : ""));
    ParamStore store;
    std::unique_ptr<Embedding> embed;
    if (tied) embed = std::make_unique<Embedding>(store, cfg);
    OutputHead head(store, cfg, tied ? &embed->token_table() : nullptr);
    finish_store(store);
    const Param* w = store.find(tied ? "embed.tok.weight" : "head.weight");
    ASSERT_NE(w, nullptr);
    // The padding rows of the output weight start at zero; give them values, which must not
    // matter: their logits are excluded from the softmax.
    for (int64_t i = cfg.vocab * cfg.d_model; i < w->global.numel(); ++i) w->value.f32()[i] = 5.0f;
    StepContext ctx = context(true);
    const int64_t N = kB * cfg.seq_len, C = cfg.d_model;
    FVec x = randn(N * C, 51);
    const std::vector<int32_t> targets = token_ids(N, cfg.vocab, 52);
    const Tensor tt = view_of(targets.data(), {kB, cfg.seq_len});
    auto loss = [&] {
      ctx.training = false;
      return head.forward(ctx, mat(x, N, C), tt);
    };
    ctx.training = true;
    const double L = head.forward(ctx, mat(x, N, C), tt);
    EXPECT_NEAR(L, loss(), 1e-9 * std::abs(L));  // training and eval forward agree
    FVec dx(N * C, 123.0f);
    head.backward(ctx, mat(dx, N, C));
    const FVec grads = copy_grads(store);
    GradChecker chk(loss, 53);
    chk.check("x", x.data(), N * C, dx.data(), -1);
    chk.check_params(store, grads, -1);
    expect_all_pass(chk, N * C + planned_checks(store, -1));
    for (int64_t i = cfg.vocab * C; i < w->global.numel(); ++i)
      ASSERT_EQ(grads[w->offset + i], 0.0f) << "padding element " << i;
  }
}

// ---- the whole model ---------------------------------------------------------------------

class GradCheckModel : public GradCheck {
 protected:
  // Summed token loss of one micro-batch; gradients of a sample of every parameter tensor.
  void run(const ModelConfig& cfg, uint32_t seed) {
    ParamStore store;
    Transformer model(cfg, store);
    finish_store(store, seed);
    EXPECT_EQ(store.params().size(), size_t(cfg.layers * (cfg.arch == Arch::llama ? 9 : 16) +
                                            (cfg.arch == Arch::llama ? 3 : 4)));
    StepContext ctx = context(true);
    const int64_t N = kB * cfg.seq_len;
    const std::vector<int32_t> ids = token_ids(N, cfg.vocab, seed + 1);
    const std::vector<int32_t> targets = token_ids(N, cfg.vocab, seed + 2);
    const Tensor ti = view_of(ids.data(), {kB, cfg.seq_len});
    const Tensor tt = view_of(targets.data(), {kB, cfg.seq_len});
    auto loss = [&] {
      ctx.training = false;
      return model.forward(ctx, ti, tt);
    };
    ctx.training = true;
    ctx.loss_scale = 1.0f;
    const double L = model.forward(ctx, ti, tt);
    ASSERT_TRUE(std::isfinite(L));
    model.backward(ctx);
    const FVec grads = copy_grads(store);
    GradChecker chk(loss, seed + 3);
    chk.check_params(store, grads);
    expect_all_pass(chk, planned_checks(store));
  }
};

TEST_F(GradCheckModel, TransformerLlama) {
  const ModelConfig cfg = tiny_config(Arch::llama);
  ASSERT_FALSE(cfg.tie_embeddings);
  run(cfg, 61);
}

TEST_F(GradCheckModel, TransformerGpt2FromDeck) {
  const Deck deck = Deck::from_text(
      "[model]\narch = gpt2\nlayers = 2\nd_model = 16\nheads = 2\nvocab = 11\n"
      "vocab_multiple = 8\nseq_len = 5\nffn_hidden = 24\ninit_std = 0.3\n"
      "[data]\npath = unused.txt\n",
      {});
  const ModelConfig cfg = ModelConfig::from(RunConfig::from_deck(deck).model);
  ASSERT_TRUE(cfg.tie_embeddings);
  ASSERT_EQ(cfg.vocab_padded, 16);
  ASSERT_EQ(cfg.head_dim, 8);
  run(cfg, 62);
}

// ---- the checker itself catches wrong gradients -----------------------------------------

// The tolerances above must not be so loose that a wrong gradient passes: each deliberately
// wrong variant of correct analytic gradients is rejected.
TEST_F(GradCheck, CheckerRejectsWrongGradients) {
  const ModelConfig cfg = tiny_config(Arch::gpt2);
  ParamStore store;
  Norm norm(store, "norm", cfg.d_model, /*layernorm=*/true, 1e-5f);
  Linear lin(store, "lin", cfg.d_model, cfg.d_model, /*bias=*/true, 0.3f);
  finish_store(store);
  const int64_t N = 10, C = cfg.d_model;
  FVec x = randn(N * C, 71), R = randn(N * C, 72), n1(N * C), y(N * C), mean(N), rstd(N);
  // L = sum(lin(norm(x)) * R)
  auto loss = [&] {
    norm.forward(mat(x, N, C), mat(n1, N, C), view_of(mean.data(), {N}), view_of(rstd.data(), {N}));
    lin.forward(sc_, mat(n1, N, C), mat(y, N, C));
    return dot(y.data(), R);
  };
  loss();
  FVec dn(N * C), dx(N * C);
  lin.backward(sc_, mat(n1, N, C), mat(R, N, C), mat(dn, N, C));
  norm.backward(mat(x, N, C), mat(dn, N, C), view_of(mean.data(), {N}), view_of(rstd.data(), {N}),
                mat(dx, N, C));
  const FVec grads = copy_grads(store);
  const Param& W = *store.find("lin.weight");
  const float* g_w = grads.data() + W.offset;

  auto failures = [&](const char* what, float* values, const FVec& analytic) {
    GradChecker chk(loss, 73, /*quiet=*/true);
    chk.check(what, values, int64_t(analytic.size()), analytic.data(), -1);
    return chk.failed();
  };
  // The correct gradients pass.
  EXPECT_EQ(failures("x", x.data(), dx), 0);
  const FVec gw(g_w, g_w + C * C);
  EXPECT_EQ(failures("W", W.value.f32(), gw), 0);

  // Wrong sign.
  FVec wrong = dx;
  for (float& v : wrong) v = -v;
  EXPECT_GT(failures("-dx", x.data(), wrong), int(N * C) / 2);
  // Transposed weight gradient (W is square).
  wrong = gw;
  for (int64_t i = 0; i < C; ++i)
    for (int64_t j = 0; j < C; ++j) wrong[i * C + j] = gw[j * C + i];
  EXPECT_GT(failures("dW^T", W.value.f32(), wrong), int(C * C) / 2);
  // LayerNorm dx without its mean and variance terms: dx = rstd * w * dy.
  wrong = dx;
  const float* w = store.find("norm.weight")->value.f32();
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < C; ++c) wrong[r * C + c] = rstd[r] * w[c] * dn[r * C + c];
  EXPECT_GT(failures("dx without the mean terms", x.data(), wrong), int(N * C) / 4);
  // A gradient 5% too large everywhere.
  wrong = dx;
  for (float& v : wrong) v *= 1.05f;
  EXPECT_GT(failures("1.05 dx", x.data(), wrong), int(N * C) / 4);
}

}  // namespace
}  // namespace tessera
