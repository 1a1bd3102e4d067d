// The planner's mixture of experts (label plan): the deck's experts reach both runtimes, their
// expert model state agrees, the all-to-all volume and the active FLOPs (doc/planning.md).
#include <gtest/gtest.h>

#include <string>

#include "../plan_cluster.hpp"
#include "perf/compute_model.hpp"
#include "perf/cost_model.hpp"
#include "perf/flops.hpp"
#include "plan/workload.hpp"

namespace tessera {
namespace {

// 4 blocks of 8 routed experts of width 256 (no bias), top 2, d_model 512.
Workload moe(const std::vector<std::string>& extra = {}) {
  std::vector<std::string> o{"--train.global_batch=16"};
  o.insert(o.end(), extra.begin(), extra.end());
  return workload_from(
      plan_config("[model]\narch = llama\nvocab = 1024\nseq_len = 256\nlayers = 4\nd_model = 512\n"
                  "heads = 8\nexperts = 8\nexperts_top_k = 2\nexpert_ffn = 256\n",
                  o, "test"));
}

double model_state(const Estimate& e) {
  return e.memory.params + e.memory.grads + e.memory.optimizer;
}

TEST(PlanMoe, DeckExpertsReachBothRuntimes) {
  const Workload w = moe();
  EXPECT_EQ(w.moe.experts, 8);
  EXPECT_EQ(w.moe.top_k, 2);
  EXPECT_EQ(w.moe.expert_ffn, 256);
  // The active FLOPs and parameters are the run's own (perf/flops.cpp), counted once.
  EXPECT_DOUBLE_EQ(workload_flops_per_token(w), model_flops_per_token(w.cfg));
  EXPECT_DOUBLE_EQ(workload_params(w), double(w.cfg.param_count()));
  EXPECT_LT(model_flops_per_token(w.cfg), 6.0 * double(w.cfg.param_count()));  // active < total
  const Cluster c = Cluster::from_text(test::kPlanCluster);
  const Estimate e =
      estimate(w, parse_layout("dp=4 ep=2 zero=0 mb=1 prec=fp32"), c, Runtime::tessera);
  EXPECT_DOUBLE_EQ(e.model_flops_per_step, model_flops_per_token(w.cfg) * 16 * 256);
}

// Where both runtimes model the same thing, the held experts' model state (ZeRO over
// N_e = max(1, N / ep)) agrees to the byte: ep 2 against ep 4 differs only by experts.
TEST(PlanMoe, RuntimesAgreeOnExpertModelState) {
  const Workload w = moe();
  const Cluster c = Cluster::from_text(test::kPlanCluster);
  for (const char* zero : {"0", "1", "2", "3"}) {
    double diff[2];
    for (Runtime rt : {Runtime::megatron, Runtime::tessera}) {
      const std::string base = std::string("dp=4 mb=1 prec=fp32 zero=") + zero;
      const Layout l2 = parse_layout(base + " ep=2"), l4 = parse_layout(base + " ep=4");
      ASSERT_EQ(layout_problem(w, l2, c, rt, 4), "");
      ASSERT_EQ(layout_problem(w, l4, c, rt, 4), "");
      diff[rt == Runtime::tessera] =
          model_state(estimate(w, l2, c, rt)) - model_state(estimate(w, l4, c, rt));
    }
    // 4 blocks x (4 - 2) experts x 3 x 512 x 256 more held at ep 2, sharded over N_e = 2 (ep
    // 4: N_e = 1): 16, 8 + 12 / 2 - 12 / 2 ... per parameter of the difference, i.e. 16, 8, 4
    // and 0 bytes for ZeRO-0..3 (ZeRO-3: 4 experts over 2 ranks hold what 2 over 1 hold).
    const double experts = 4.0 * 2 * 3 * 512 * 256;
    const double per[4] = {16, 8, 4, 0};
    EXPECT_DOUBLE_EQ(diff[0], diff[1]) << "zero " << zero;
    EXPECT_DOUBLE_EQ(diff[1], per[zero[0] - '0'] * experts) << "zero " << zero;
  }
}

TEST(PlanMoe, AllToAllBytesPerStep) {
  const Cluster c = Cluster::from_text(test::kPlanCluster);
  // Every other block MoE (every:2): 2 of the 4; m = 16 / (4 x 2) = 2 micro-batches.
  const Workload w = moe({"--model.moe_layers=every:2"});
  const Estimate e = estimate(w, parse_layout("dp=4 ep=2 mb=2 prec=fp32"), c, Runtime::tessera);
  ASSERT_EQ(e.microbatches, 2);
  // 2 blocks x 2 micro-batches x (4 all-to-alls x (2 x 256 tokens x top 2) rows x 512 x 4
  // bytes + the count exchange's 8 floats).
  EXPECT_DOUBLE_EQ(e.ep_bytes_per_step, 2.0 * 2 * (4.0 * (2 * 256 * 2) * 512 * 4 + 8 * 4));
  // A capacity of 0.5: ceil(0.5 x 256 x 2 / 8) = 32 rows of a sequence per expert, of 64.
  const Workload half = moe({"--model.moe_layers=every:2", "--model.capacity_factor=0.5"});
  const Estimate h = estimate(half, parse_layout("dp=4 ep=2 mb=2 prec=fp32"), c, Runtime::tessera);
  EXPECT_DOUBLE_EQ(h.ep_bytes_per_step, 2.0 * 2 * (4.0 * (2 * 8 * 32) * 512 * 4 + 8 * 4));
  const Estimate one = estimate(w, parse_layout("dp=4 ep=1 mb=2 prec=fp32"), c, Runtime::tessera);
  EXPECT_DOUBLE_EQ(one.ep_bytes_per_step, 0);
}

// The two-level dispatch (ep 4 on 2 nodes of parallel.ep_nodes): inside the node the flat
// dispatch's rows, across nodes one row per token and other node it routes to, 4 times (with
// 2 k slots and k weight gradients), and tensor parallelism's share of the rows.
TEST(PlanMoe, TwoLevelBytesPerLinkLevel) {
  const Cluster c = Cluster::from_text(test::kPlanCluster);
  const std::vector<std::string> two{"--parallel.ep_dispatch=two_level", "--parallel.ep_nodes=2"};
  const Layout l = parse_layout("dp=4 ep=4 mb=2 prec=fp32");
  const Estimate flat = estimate(moe(), l, c, Runtime::tessera);
  const Estimate e = estimate(moe(two), l, c, Runtime::tessera);
  ASSERT_EQ(e.ep_cross_bytes_by_stage.size(), 1u);
  EXPECT_DOUBLE_EQ(e.ep_intra_bytes_by_stage[0], flat.ep_bytes_by_stage[0]);
  // Of 8 experts, 4 per node, top 2: a token misses a node with q = C(4,2)/C(8,2) = 6/28, so
  // it touches 2 (1 - q) nodes, half of them not its own: 11/14 rows per token.
  const double tokens = 2 * 256, m = 2, blocks = 4;
  const double per_row = (4 * 512 + 3 * 2) * 4;  // 4 rows, 2 k slots and k weight gradients
  EXPECT_DOUBLE_EQ(e.ep_cross_bytes_by_stage[0],
                   blocks * m * (tokens * (2 * (1 - 6.0 / 28)) * 0.5 * per_row + 4 * 4 * 2));
  EXPECT_DOUBLE_EQ(e.ep_bytes_per_step,
                   e.ep_intra_bytes_by_stage[0] + e.ep_cross_bytes_by_stage[0]);
  // ep_max_nodes = 1: one node per token, half the time another.
  std::vector<std::string> one = two;
  one.push_back("--parallel.ep_max_nodes=1");
  const Estimate limited = estimate(moe(one), l, c, Runtime::tessera);
  EXPECT_DOUBLE_EQ(limited.ep_cross_bytes_by_stage[0],
                   blocks * m * (tokens * 1 * 0.5 * per_row + 4 * 4 * 2));
  EXPECT_TRUE(flat.ep_cross_bytes_by_stage.empty());
}

// dualpipev's interleaved pairs (parallel.pp_pair_overlap) hide each pass's all-to-alls behind
// the other pass's compute, up to that compute's time: less exposed all-to-all time than the
// same pairs run one pass after the other, the same traffic, and the step shorter by exactly
// the hidden part. Schedules without pairs cost the same either way.
TEST(PlanMoe, DualPipeVPairsHideTheirAllToAlls) {
  const Cluster c = Cluster::from_text(test::kPlanCluster);
  const Workload on = moe(), off = moe({"--parallel.pp_pair_overlap=false"});
  const Layout l = parse_layout("dp=2 pp=2 v=2 ep=2 mb=1 prec=fp32 sched=dualpipev");
  ASSERT_EQ(layout_problem(on, l, c, Runtime::tessera, 4), "");
  const Estimate a = estimate(on, l, c, Runtime::tessera),
                 b = estimate(off, l, c, Runtime::tessera);
  EXPECT_GT(a.ep_pairs, 0);
  EXPECT_GT(a.time.ep_comm, 0);
  EXPECT_EQ(a.time.ep_comm, b.time.ep_comm);
  EXPECT_EQ(b.time.ep_hidden, 0);
  EXPECT_GT(a.time.ep_hidden, 0);
  EXPECT_LE(a.time.ep_hidden, a.time.ep_comm);
  EXPECT_LT(a.time.ep_comm - a.time.ep_hidden, b.time.ep_comm - b.time.ep_hidden);
  EXPECT_NEAR(b.step_seconds - a.step_seconds, a.time.ep_hidden, 1e-12 * b.step_seconds);
  // Each pass of a pair hides at most its own all-to-alls (two of a layer's four: a chunk's
  // forward or backward share of ep_comm / (m v)).
  const double per_pass = a.time.ep_comm / (2.0 * double(a.microbatches) * l.vpp);
  EXPECT_LE(a.time.ep_hidden, a.ep_pairs * 2 * per_pass * (1 + 1e-12));
  // Without pairs (zb-v, 1f1b) or without experts' all-to-alls (ep 1): nothing changes.
  for (const char* text :
       {"dp=2 pp=2 v=2 ep=2 mb=1 prec=fp32 sched=zb-v", "dp=2 pp=2 ep=2 mb=1 prec=fp32 sched=1f1b",
        "dp=2 pp=2 v=2 ep=1 mb=1 prec=fp32 sched=dualpipev"}) {
    const Layout k = parse_layout(text);
    ASSERT_EQ(layout_problem(on, k, c, Runtime::tessera, 4), "") << text;
    const Estimate x = estimate(on, k, c, Runtime::tessera),
                   y = estimate(off, k, c, Runtime::tessera);
    EXPECT_EQ(x.time.ep_hidden, 0) << text;
    EXPECT_EQ(x.step_seconds, y.step_seconds) << text;
  }
}

// (c) The Megatron-style runtime runs dualpipev as a GPU framework does: its pairs hide the
// experts' all-to-alls by the same rule (with tp, ZeRO-2/3 and recompute too, which tessera's
// runtime still pairs sequentially), and parallel.pp_pair_overlap = false turns that off.
TEST(PlanMoe, MegatronDualPipeVPairsHideTheirAllToAlls) {
  const Cluster c = Cluster::from_text(test::kPlanCluster);
  const Workload on = moe(), off = moe({"--parallel.pp_pair_overlap=false"});
  for (const char* text : {"dp=2 pp=2 v=2 ep=2 mb=1 prec=bf16 sched=dualpipev",
                           "dp=2 tp=2 pp=2 v=2 ep=2 mb=1 zero=3 rc=full sp=1 sched=dualpipev"}) {
    const Layout l = parse_layout(text);
    const int n = l.accelerators();
    ASSERT_EQ(layout_problem(on, l, c, Runtime::megatron, n), "") << text;
    const Estimate a = estimate(on, l, c, Runtime::megatron),
                   b = estimate(off, l, c, Runtime::megatron);
    EXPECT_GT(a.ep_pairs, 0) << text;
    EXPECT_GT(a.time.ep_comm, 0) << text;
    EXPECT_EQ(a.time.ep_comm, b.time.ep_comm) << text;
    EXPECT_EQ(b.time.ep_hidden, 0) << text;
    EXPECT_GT(a.time.ep_hidden, 0) << text;
    EXPECT_LE(a.time.ep_hidden, a.time.ep_comm) << text;
    EXPECT_NEAR(b.step_seconds - a.step_seconds, a.time.ep_hidden, 1e-12 * b.step_seconds);
    const double per_pass = a.time.ep_comm / (2.0 * double(a.microbatches) * l.vpp);
    EXPECT_LE(a.time.ep_hidden, a.ep_pairs * 2 * per_pass * (1 + 1e-12)) << text;
  }
  // The runtimes agree on the rule where tessera interleaves: the same pairs per step.
  const Layout fp32 = parse_layout("dp=2 pp=2 v=2 ep=2 mb=1 prec=fp32 sched=dualpipev");
  EXPECT_EQ(estimate(on, fp32, c, Runtime::megatron).ep_pairs,
            estimate(on, fp32, c, Runtime::tessera).ep_pairs);
  // zb-v has no pairs: nothing hidden, the same all-to-all time as dualpipev.
  const Layout zbv = parse_layout("dp=2 pp=2 v=2 ep=2 mb=1 prec=bf16 sched=zb-v");
  const Estimate z = estimate(on, zbv, c, Runtime::megatron);
  EXPECT_EQ(z.time.ep_hidden, 0);
  EXPECT_EQ(z.time.ep_comm,
            estimate(on, parse_layout("dp=2 pp=2 v=2 ep=2 mb=1 prec=bf16 sched=dualpipev"), c,
                     Runtime::megatron)
                .time.ep_comm);
}

TEST(PlanMoe, TesseraRuntimeRefusesWhatItDoesNotModel) {
  const Workload w = moe();
  const Cluster c = Cluster::from_text(test::kPlanCluster);
  // tp, pp, bf16, cp and recompute are modelled (plan_validate_tessera's moe_* cases); the
  // runtime's own refusals remain (cp with the two-level dispatch).
  EXPECT_EQ(layout_problem(w, parse_layout("dp=2 tp=2 ep=2 prec=fp32"), c, Runtime::tessera, 4),
            "");
  EXPECT_EQ(layout_problem(w, parse_layout("dp=2 pp=2 ep=2 prec=fp32"), c, Runtime::tessera, 4),
            "");
  EXPECT_EQ(layout_problem(w, parse_layout("dp=4 ep=2 prec=bf16"), c, Runtime::tessera, 4), "");
  EXPECT_EQ(layout_problem(w, parse_layout("dp=4 ep=2 prec=fp32"), c, Runtime::tessera, 4), "");
  EXPECT_EQ(layout_problem(w, parse_layout("dp=2 cp=2 ep=2 prec=fp32"), c, Runtime::tessera, 4),
            "");
  EXPECT_EQ(
      layout_problem(w, parse_layout("dp=4 ep=2 prec=fp32 rc=selective"), c, Runtime::tessera, 4),
      "");
  // The split-backward kinds too: the experts' weight-gradient operands are held in regions
  // sized for the worst routing (model/weight_grads.hpp), so their memory is predicted.
  for (const char* sched : {"zb-h1", "zb-v", "dualpipev"})
    EXPECT_EQ(layout_problem(w,
                             parse_layout(std::string("dp=2 pp=2 ep=2 prec=fp32 sched=") + sched +
                                          (std::string(sched) == "zb-h1" ? "" : " v=2")),
                             c, Runtime::tessera, 4),
              "")
        << sched;
  const Workload two = moe({"--parallel.ep_dispatch=two_level", "--parallel.ep_nodes=2"});
  EXPECT_NE(layout_problem(two, parse_layout("dp=2 cp=2 ep=2 prec=fp32"), c, Runtime::tessera, 4),
            "");
}

}  // namespace
}  // namespace tessera
