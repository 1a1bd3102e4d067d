// RankLayout: what a layout means for one rank, made once from the configuration and the
// grid; the run, its memory check before allocation, its summary and the planner read it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../plan_cluster.hpp"
#include "core/error.hpp"
#include "parallel/rank_layout.hpp"
#include "perf/cost_model.hpp"
#include "perf/tessera_memory.hpp"
#include "plan/workload.hpp"

namespace tessera {
namespace {

const char* kDeck =
    "[model]\narch = llama\nlayers = 4\nd_model = 64\nheads = 4\nkv_heads = 2\nseq_len = 32\n"
    "vocab = 256\n[data]\npath = corpus.h5\n";

RunConfig config(std::vector<std::string> overrides) {
  return RunConfig::from_deck(Deck::from_text(kDeck, overrides, "test"));
}

// The model-state bytes of a layout three ways: RankLayout::model_state (what tessera's check
// before allocation refuses a model by, and the formula its summary prints), the planner's
// estimate of the same layout (--runtime tessera), and the closed form of doc/precision.md:
// fp32 16 Psi at ZeRO-0 and 16 Psi / N at ZeRO-3, a 16-bit run adding its compute copy,
// 2 Psi and 2 Psi / N. The plan_validate_tessera test compares the same formula with the
// allocator's bytes.
TEST(RankLayout, ModelStateIsThePlannersForFp32AndBf16AtZero0And3) {
  const Cluster cl = Cluster::from_text(test::kPlanCluster);
  for (const char* prec : {"fp32", "bf16"}) {
    for (int zero : {0, 3}) {
      SCOPED_TRACE(std::string(prec) + " zero " + std::to_string(zero));
      const RunConfig run =
          config({std::string("--train.precision=") + prec, "--parallel.zero=" + std::to_string(zero),
                  "--train.micro_batch=2", "--train.global_batch=16"});
      const GridLayout grid({1, 1, 1, 4, 1}, GridLayout::kDefaultOrder, 4);
      const RankLayout r = RankLayout::make(run, grid, 2, 1);
      const double psi = r.params, n = zero == 3 ? 4 : 1;
      const double copy = std::string(prec) == "bf16" ? 2 * psi / n : 0;
      EXPECT_EQ(r.model_state().total(), 16 * psi / n + copy);
      EXPECT_EQ(r.shard_ranks, int64_t(n));
      EXPECT_EQ(r.model.compute, std::string(prec) == "bf16" ? DType::bf16 : DType::f32);

      Layout l;
      l.dp = 4, l.zero = zero, l.micro_batch = 2;
      l.precision = precision_names(run.train.precision).planner;
      const Workload w = workload_from(run);
      ASSERT_EQ(layout_problem(w, l, cl, Runtime::tessera, 4), "");
      const Estimate e = estimate(w, l, cl, Runtime::tessera);
      EXPECT_EQ(e.memory.params + e.memory.grads + e.memory.optimizer, r.model_state().total());
      EXPECT_EQ(e.params_per_rank, psi);
      // The planner's spelling of the run's layout, and back.
      EXPECT_EQ(tessera_layout(r), l);
    }
  }
}

// Each layout check runs in RankLayout::make, with the error text a run prints; a planned
// layout is refused with the same text.
TEST(RankLayout, ChecksTheLayoutOnceWithTheRunsErrors) {
  const GridLayout dp4({1, 1, 1, 4, 1}, GridLayout::kDefaultOrder, 4);
  auto error = [&](std::vector<std::string> overrides, const GridLayout& g) {
    try {
      (void)RankLayout::make(config(overrides), g, 0, 1);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error({"--train.micro_batch=2", "--train.global_batch=16"}, dp4), "");
  EXPECT_NE(error({"--train.micro_batch=2", "--train.global_batch=12"}, dp4)
                .find("is not a multiple of train.micro_batch x dp"),
            std::string::npos);
  EXPECT_NE(error({"--train.micro_batch=2", "--parallel.zero=1", "--parallel.shard_group=3"}, dp4)
                .find("does not divide the data-parallel degree 4"),
            std::string::npos);
  EXPECT_NE(error({"--train.micro_batch=2", "--parallel.shard_group=2"}, dp4)
                .find("which needs parallel.zero >= 1"),
            std::string::npos);
  const GridLayout tp4({4, 1, 1, 1, 1}, GridLayout::kDefaultOrder, 4);
  EXPECT_NE(error({"--train.micro_batch=1", "--model.seq_len=30", "--model.kv_heads=4",
                   "--parallel.sequence_parallel=true"},
                  tp4)
                .find("does not divide them"),
            std::string::npos);
  const GridLayout pp4({1, 1, 1, 1, 4}, GridLayout::kDefaultOrder, 4);
  EXPECT_NE(error({"--train.micro_batch=1", "--train.global_batch=8", "--parallel.pp_virtual=2",
                   "--parallel.pp_schedule=interleaved"},
                  pp4)
                .find("without"),
            std::string::npos);
}

// The split-backward schedules run: a V-shaped one puts the embedding and the head on the
// first stage (its loss stage), so no stage holds a copy of a tied token table.
TEST(RankLayout, PlacesTheSplitSchedulesChunks) {
  RunConfig run = config({"--train.micro_batch=1", "--train.global_batch=8", "--parallel.pp=2"});
  const GridLayout grid({1, 1, 1, 1, 2}, GridLayout::kDefaultOrder, 2);
  for (PipeSchedule kind : {PipeSchedule::zb_h1, PipeSchedule::zb_v, PipeSchedule::dualpipe_v}) {
    SCOPED_TRACE(to_string(kind));
    run.parallel.pp_schedule = kind;
    run.parallel.pp_virtual = kind == PipeSchedule::zb_h1 ? 1 : 2;
    const RankLayout first = RankLayout::make(run, grid, 0, 1);
    const RankLayout last = RankLayout::make(run, grid, 1, 1);
    EXPECT_TRUE(first.schedule.split_backward());
    const bool v = kind != PipeSchedule::zb_h1;
    EXPECT_EQ(first.schedule.loss_stage(), v ? 0 : 1);
    ASSERT_EQ(first.chunks.size(), size_t(v ? 2 : 1));
    EXPECT_TRUE(first.chunks.front().embedding);
    EXPECT_EQ(first.chunks.back().head, v);
    EXPECT_FALSE(last.chunks.front().embedding);
    EXPECT_EQ(last.chunks.back().head, !v);
    if (v) EXPECT_EQ(last.chunks[0].last, last.chunks[1].first);  // the turn: one stage
  }
}

// A pipeline rank holds its stage's parts only: the first stage the embedding and its blocks,
// the last its blocks, the head and (tied tables) a copy of the token table; the elements
// per part add up to what the rank's store holds (the trainer checks this equality at start).
TEST(RankLayout, PipelineStagesHoldTheirParts) {
  const RunConfig run = config({"--model.arch=gpt2", "--model.kv_heads=4", "--train.micro_batch=1",
                                "--train.global_batch=4", "--parallel.pp=2"});
  const GridLayout grid({1, 1, 1, 1, 2}, GridLayout::kDefaultOrder, 2);
  const RankLayout first = RankLayout::make(run, grid, 0, 1);
  const RankLayout last = RankLayout::make(run, grid, 1, 1);
  EXPECT_EQ(first.schedule.stages, 2);
  EXPECT_EQ(first.chunk_layers, (std::vector<int64_t>{2, 2}));
  ASSERT_EQ(first.part_elements.size(), 6u);
  EXPECT_GT(first.part_elements[0], 0);
  EXPECT_EQ(first.part_elements[5], 0);
  EXPECT_EQ(last.part_elements[0], first.part_elements[0] - 32 * 64);  // table, no positions
  EXPECT_EQ(last.part_elements[1], 0);
  EXPECT_GT(last.part_elements[5], 0);
  double sum = 0;
  for (double n : last.part_elements) sum += n;
  EXPECT_EQ(last.params, sum);
}

}  // namespace
}  // namespace tessera
