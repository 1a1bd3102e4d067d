// Activation recompute (train.recompute, doc/recompute.md): which blocks rebuild, what they
// keep (perf/memory.hpp), the work they repeat (perf/flops.hpp), and that a model with
// recompute computes the same bits as one without.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/process_grid.hpp"
#include "config/run_config.hpp"
#include "core/error.hpp"
#include "model/param.hpp"
#include "model/transformer.hpp"
#include "mpi_environment.hpp"
#include "perf/flops.hpp"
#include "perf/memory.hpp"

namespace tessera {
namespace {

ModelConfig config(Arch arch, Recompute mode, int64_t layers_recomputed = 0) {
  const std::string text = std::string("[model]\narch = ") + to_string(arch) +
                           "\nlayers = 3\nd_model = 16\nheads = 4\nvocab = 11\nvocab_multiple = 8\n"
                           "seq_len = 6\nffn_hidden = 24\ninit_std = 0.3\n[data]\npath = x\n";
  const RunConfig run = RunConfig::from_deck(
      Deck::from_text(text, {std::string("--train.recompute=") + to_string(mode),
                             "--train.recompute_layers=" + std::to_string(layers_recomputed)}));
  return ModelConfig::from(run.model, run.train);
}

TEST(Recompute, BlockMethodCountsFromEachChunksStart) {
  const ModelConfig two = config(Arch::llama, Recompute::full, 2);
  EXPECT_EQ(two.block_recompute(0), Recompute::full);
  EXPECT_EQ(two.block_recompute(1), Recompute::full);
  EXPECT_EQ(two.block_recompute(2), Recompute::none);
  const ModelConfig all = config(Arch::llama, Recompute::full);
  EXPECT_EQ(all.block_recompute(5), Recompute::full);
  EXPECT_EQ(config(Arch::gpt2, Recompute::selective).block_recompute(5), Recompute::selective);
}

TEST(Recompute, LayersWithoutFullIsAnError) {
  try {
    config(Arch::llama, Recompute::selective, 2);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(e.collective());
    EXPECT_NE(std::string(e.what()).find("train.recompute_layers = 2 needs train.recompute = full"),
              std::string::npos)
        << e.what();
  }
}

// Per block, b = 2 sequences of T = 6 tokens (N = 12), C = 16, 4 heads of 4, F = 24, fp32.
TEST(Recompute, KeptBytesPerBlock) {
  const ModelConfig g = config(Arch::gpt2, Recompute::none);
  const double N = 12, C = 16, F = 24, H = 4;
  // n1, h, n2, out; two means and two rstds; q, k, v, att; lse; up, act.
  const double none = 4 * (4 * N * C + 4 * N + 4 * N * C + 2 * H * 6 + 2 * N * F);
  EXPECT_EQ(activation_bytes_per_block(g, 2), none);
  EXPECT_EQ(block_kept_bytes(g, 2, Recompute::none), none);
  // Selective drops att, lse and act; full keeps the output only (the next block's input).
  EXPECT_EQ(block_kept_bytes(g, 2, Recompute::selective), none - 4 * (N * C + 2 * H * 6 + N * F));
  EXPECT_EQ(block_kept_bytes(g, 2, Recompute::full), 4 * N * C);
  EXPECT_EQ(rebuilt_bytes(g, 2), 0);
  EXPECT_EQ(rebuilt_bytes(config(Arch::gpt2, Recompute::full), 2), none);
  // Two of three blocks of a chunk recomputed, the third keeps everything.
  const ModelConfig two = config(Arch::gpt2, Recompute::full, 2);
  EXPECT_EQ(chunk_kept_bytes(two, 2, 3, 0), 2 * 4 * N * C + none);
  const double outside = 4 * (N * C + 2 * N + N * C);  // embedding output; head
  EXPECT_EQ(activation_bytes(two, 2), 2 * 4 * N * C + none + none + outside);
}

TEST(Recompute, RepeatedForwardFlops) {
  const ModelConfig none = config(Arch::llama, Recompute::none);
  EXPECT_EQ(recompute_flops_per_token(none, {3}), 0);
  const double core = 4.0 * 6 * 16;  // 4 T (heads x head_dim) per block
  EXPECT_EQ(recompute_flops_per_token(config(Arch::llama, Recompute::selective), {3}), 3 * core);
  // A block's GEMM weights: q, k, v, o (16 x 16 each) and gate, up, down (16 x 24 each).
  const double gemm = 4 * 16 * 16 + 3 * 16 * 24;
  EXPECT_EQ(recompute_flops_per_token(config(Arch::llama, Recompute::full), {3}),
            3 * (2 * gemm + core));
  // recompute_layers = 1 in chunks of 2 and 1 blocks: two blocks rerun.
  EXPECT_EQ(recompute_flops_per_token(config(Arch::llama, Recompute::full, 1), {2, 1}),
            2 * (2 * gemm + core));
}

// Two micro-batches in flight (slots 0 and 1, as a pipeline stage holds them), forwards then
// backwards: every mode gives the losses and gradients of the model without recompute, bit
// for bit, though the rebuilt set is shared by every block and both micro-batches.
class RecomputeModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { test::require_mpi(); }

  struct Result {
    std::vector<double> losses;
    std::vector<float> grads;
    double activation_bytes = 0;
  };
  Result run(const ModelConfig& cfg) {
    Allocator alloc;
    Communicator comm(MPI_COMM_SELF, "self");
    ParallelContext par{comm, comm};
    Scratch scratch(alloc);
    ParamStore store;
    Transformer model(cfg, store);
    store.finalize(alloc);
    store.initialize(11);
    store.zero_grads();
    const int64_t B = 2, T = cfg.seq_len;
    std::vector<std::vector<int32_t>> ids(2), targets(2);
    for (int m = 0; m < 2; ++m)
      for (int64_t i = 0; i < B * T; ++i) {
        ids[size_t(m)].push_back(int32_t((7 * i + 3 * m + 1) % cfg.vocab));
        targets[size_t(m)].push_back(int32_t((5 * i + m + 2) % cfg.vocab));
      }
    Result r;
    std::vector<StepContext> ctx;
    for (int m = 0; m < 2; ++m) ctx.push_back(StepContext{alloc, par, scratch, m, B, true, 0.01f});
    for (int m = 0; m < 2; ++m)
      r.losses.push_back(model.forward(ctx[size_t(m)], view_of(ids[size_t(m)].data(), {B, T}),
                                       view_of(targets[size_t(m)].data(), {B, T})));
    for (int m = 0; m < 2; ++m) model.backward(ctx[size_t(m)]);
    r.grads.assign(store.grads(), store.grads() + store.numel());
    r.activation_bytes = double(alloc.peak(Charge::activations));
    return r;
  }
};

TEST_F(RecomputeModel, EveryModeGivesTheSameBits) {
  for (Arch arch : {Arch::llama, Arch::gpt2}) {
    const Result none = run(config(arch, Recompute::none));
    double norm = 0;
    for (float g : none.grads) norm += double(g) * g;
    ASSERT_GT(norm, 0);
    for (auto [mode, layers] : {std::pair{Recompute::selective, 0}, std::pair{Recompute::full, 0},
                                std::pair{Recompute::full, 2}}) {
      SCOPED_TRACE(std::string(to_string(arch)) + " " + to_string(mode) + " layers " +
                   std::to_string(layers));
      const Result r = run(config(arch, mode, layers));
      EXPECT_EQ(r.losses, none.losses);
      ASSERT_EQ(r.grads.size(), none.grads.size());
      EXPECT_EQ(std::memcmp(r.grads.data(), none.grads.data(), r.grads.size() * sizeof(float)), 0);
      EXPECT_LT(r.activation_bytes, none.activation_bytes);
    }
  }
}

}  // namespace
}  // namespace tessera
