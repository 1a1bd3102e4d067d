// The planner's second pass (label plan): placement of groups from the rank order, overlap of
// DP/ZeRO traffic bounded layer by layer, and layouts the first pass could not express
// (uneven pipeline cuts, rc=full:N, ZeRO-2/3 with pipelines, causal attention).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/error.hpp"
#include "parallel/pp/stage_layers.hpp"
#include "perf/activation_memory.hpp"
#include "perf/comm_model.hpp"
#include "perf/compute_model.hpp"
#include "perf/cost_model.hpp"
#include "perf/overlap.hpp"
#include "perf/placement.hpp"
#include "plan/search.hpp"
#include "plan/workload.hpp"
#include "../plan_cluster.hpp"

namespace tessera {
namespace {

const char* const kCluster = test::kPlanCluster;

Workload gpt(int64_t layers, int64_t global_batch, int64_t d_model = 4096, int64_t heads = 32) {
  Workload w = workload_from(plan_config(
      "[model]\narch = gpt2\nvocab = 51200\nseq_len = 2048\n",
      {"--model.layers=" + std::to_string(layers), "--model.d_model=" + std::to_string(d_model),
       "--model.heads=" + std::to_string(heads),
       "--train.global_batch=" + std::to_string(global_batch)},
      "test"));
  w.flash_attention = false;
  w.dropout = true;
  return w;
}

// ---- placement ----

TEST(PlanPlacement, Tp6OnEightAcceleratorNodesCrossesNodes) {
  Cluster c = Cluster::from_text(kCluster);
  c.pod_nodes = 0;                          // one network, no pods
  const Workload w = gpt(4, 64, 3072, 24);  // 24 heads: tp = 6 divides them
  Layout l = parse_layout("tp=6 dp=8 zero=1");
  const GroupLinks g = group_links(l, c);
  // Ranks 6-11 form the second TP group: 2 members on node 0, 4 on node 1.
  EXPECT_TRUE(g.tp.crosses_nodes());
  EXPECT_EQ(g.tp.place.nodes, 2);
  EXPECT_EQ(g.tp.place.per_node_min, 2);
  EXPECT_EQ(g.tp.place.per_node_max, 4);
  EXPECT_STREQ(g.tp.name, "inter-node");
  // Its all-reduces cost more than a ring inside one node would: 2 x 3/4 B on the node
  // link, then 2 x 1/2 x B/2 over the network (the 2 members of node 0 carry it).
  const double B = 1e8;
  EXPECT_DOUBLE_EQ(all_reduce_seconds(B, 6, g.tp), 2 * 0.75 * B / 100e9 + 2 * 0.5 * B / 2 / 10e9);
  EXPECT_GT(all_reduce_seconds(B, 6, g.tp), 3 * all_reduce_seconds(B, 6, GroupLink(c.intra)));
  // tp = 8 stays in a node.
  const GroupLinks g8 = group_links(parse_layout("tp=8 dp=6"), c);
  EXPECT_FALSE(g8.tp.crosses_nodes());
  EXPECT_STREQ(g8.tp.name, "intra-node");
  // The estimate warns and the search turns the family down as TP across nodes.
  const Estimate e = estimate(w, l, c, Runtime::megatron);
  ASSERT_FALSE(e.warnings.empty());
  EXPECT_NE(e.warnings.front().find("TP group of 6 spans nodes"), std::string::npos);
  SearchSpace s;
  s.tp = {6};
  s.pp = {1};
  const SearchResult r = search(w, c, 48, Runtime::megatron, s);
  EXPECT_TRUE(r.accepted.empty());
  ASSERT_EQ(r.rejected.size(), 1u);
  EXPECT_GT(r.rejected.front().tp_across_nodes, 0);
}

TEST(PlanPlacement, HierarchicalCollectiveCostsOnlyTheCrossingShareOnTheNetwork) {
  Cluster c = Cluster::from_text(kCluster);
  c.pod.latency = 0;
  // 16 consecutive ranks: 8 on each of two nodes of one pod.
  std::vector<int> ranks;
  for (int r = 0; r < 16; ++r) ranks.push_back(r);
  const GroupLink g = group_link(place_group(ranks, c), c);
  const double B = 1e9;
  const CollectiveTime t = reduce_scatter_time(B, 16, g);
  EXPECT_DOUBLE_EQ(t.node, 7.0 / 8 * B / 100e9);
  EXPECT_DOUBLE_EQ(t.network, 1.0 / 2 * (B / 8) / 10e9);
  // One member per node: the plain ring on the network.
  const std::vector<int> spread{0, 8, 16, 24};
  const GroupLink s = group_link(place_group(spread, c), c);
  EXPECT_DOUBLE_EQ(reduce_scatter_seconds(B, 4, s), 3.0 / 4 * B / 10e9);
  // Two pods of one member each: the spine's bandwidth (10 / 2 GB/s).
  const GroupLink p = group_link(place_group({0, 32}, c), c);
  EXPECT_TRUE(p.crosses_pods());
  EXPECT_DOUBLE_EQ(reduce_scatter_seconds(B, 2, p), 0.5 * B / 5e9);
  EXPECT_EQ(describe(g.place), "16 members on 2 nodes (8 per node), one pod");
}

TEST(PlanPlacement, RankOrderDecidesWhichGroupCrossesPods) {
  const Cluster c = Cluster::from_text(kCluster);
  // 128 accelerators = 4 pods of 32; tp 8 x pp 4 x dp 4.
  Layout l = parse_layout("tp=8 pp=4 dp=4 zero=1");
  const GroupLinks def = group_links(l, c);  // tp-cp-ep-dp-pp: pp slowest
  EXPECT_STREQ(def.tp.name, "intra-node");
  EXPECT_STREQ(def.dp.name, "inter-node");  // ranks 0, 8, 16, 24: one pod
  EXPECT_STREQ(def.pp.name, "inter-pod");   // ranks 0, 32, 64, 96
  l.order = "tp-cp-pp-dp-ep";
  const GroupLinks alt = group_links(l, c);  // pipeline neighbours, dp slowest
  EXPECT_STREQ(alt.tp.name, "intra-node");
  EXPECT_STREQ(alt.pp.name, "inter-node");
  EXPECT_STREQ(alt.dp.name, "inter-pod");
  EXPECT_EQ(alt.dp.place.pods, 4);
  // The pipeline's sends get faster, the gradient reduction slower.
  const Workload w = gpt(8, 64);
  EXPECT_LT(pp_seconds_per_microbatch(w, l, alt.pp), pp_seconds_per_microbatch(w, l, def.pp));
  EXPECT_GT(all_reduce_seconds(1e9, 4, alt.dp), all_reduce_seconds(1e9, 4, def.dp));
  // The layout string carries a non-default order and parses back.
  EXPECT_NE(to_string(l).find("order=tp-cp-pp-dp-ep"), std::string::npos);
  EXPECT_EQ(parse_layout(to_string(l)), l);
  EXPECT_EQ(to_string(parse_layout("tp=8")).find("order="), std::string::npos);
  // A bad order is a layout problem naming it.
  l.order = "tp-pp-dp";
  EXPECT_NE(layout_problem(w, l, c, Runtime::megatron, 128).find("order = tp-pp-dp"),
            std::string::npos);
  // The search tries both orders for layouts with a pipeline and data parallelism.
  SearchSpace s;
  s.tp = {8};
  s.pp = {4};
  s.zero = {1};
  s.micro_batch = {1};
  s.recompute = {Recompute::full};
  s.seq_parallel = {0};
  s.partial_recompute = false;
  s.hsdp = false;
  const SearchResult r = search(w, c, 128, Runtime::megatron, s);
  bool def_seen = false, alt_seen = false;
  for (const Estimate& e : r.accepted) {
    def_seen |= e.layout.order == "tp-cp-ep-dp-pp";
    alt_seen |= e.layout.order == "tp-cp-pp-dp-ep";
  }
  EXPECT_TRUE(def_seen && alt_seen);
}

// ---- overlap ----

TEST(PlanOverlap, TpTrafficHoldsTheNodeLinks) {
  // 3 s on the node's links cannot hide behind 5 s of TP all-reduces, only behind 2 s of
  // compute; on the network it can hide behind both.
  EXPECT_DOUBLE_EQ(exposed_behind({3, 0}, 2, 5), 1);
  EXPECT_DOUBLE_EQ(exposed_behind({0, 3}, 2, 5), 0);
  EXPECT_DOUBLE_EQ(exposed_behind({1, 7}, 2, 5), 1);
}

TEST(PlanOverlap, Zero3GatherLongerThanALayerLeavesTheRemainderExposed) {
  // ZeRO-3 over 16 ranks on two nodes, no TP: each layer's gather crosses the network.
  const Cluster base = Cluster::from_text(kCluster);
  const Workload w = gpt(8, 16);
  const Layout l = parse_layout("dp=16 zero=3 mb=1");
  const double M = 1, Ls = 8;
  for (const double network_gbs : {10.0, 0.5}) {
    Cluster c = base;
    c.inter.bw = network_gbs * 1e9;
    const Estimate e = estimate(w, l, c, Runtime::megatron);
    const LayerCompute lc = layer_compute(w, l, c, false);
    const double Pl = e.params_per_rank / Ls;
    const double G = all_gather_seconds(2 * Pl, 16, e.links.shard);
    const double R = reduce_scatter_seconds(2 * Pl, 16, e.links.shard);
    // Forward: the first gather, then per layer what exceeds the previous layer's forward;
    // backward: the first gather and the last reduction, then per layer (gather + reduction)
    // beyond the next layer's backward.
    const double expect = M * (G + (Ls - 1) * std::max(0.0, G - lc.forward()) + G + R +
                               (Ls - 1) * std::max(0.0, G + R - lc.backward()));
    EXPECT_NEAR(e.time.dp_comm - e.time.dp_hidden, expect, 1e-9 * expect) << network_gbs;
    EXPECT_NEAR(e.time.dp_comm, M * Ls * (2 * G + R), 1e-9 * e.time.dp_comm);
    if (network_gbs < 1) {
      // The gather takes longer than a layer's forward: per layer, the remainder is exposed.
      ASSERT_GT(G, lc.forward());
      EXPECT_GE(e.time.dp_comm - e.time.dp_hidden,
                M * (2 * G + R) + (Ls - 1) * (G - lc.forward()) * (1 - 1e-12));
    } else {
      // Traffic well below compute (which the first pass hid it all behind): still the
      // first gather and the last reduction of each pass are exposed, and nothing else.
      ASSERT_LT(G + R, lc.backward());
      ASSERT_LT(e.time.dp_comm, e.time.compute);
      EXPECT_NEAR(e.time.dp_comm - e.time.dp_hidden, M * (2 * G + R), 1e-9 * expect);
      EXPECT_GT(M * (2 * G + R), 0);
    }
  }
}

TEST(PlanOverlap, ExplainShowsEachTerm) {
  const Cluster c = Cluster::from_text(kCluster);
  const Estimate e = estimate(gpt(8, 64), parse_layout("dp=16 zero=1 mb=1"), c, Runtime::megatron);
  ASSERT_EQ(e.dp_overlap.terms.size(), 3u);
  EXPECT_NE(e.dp_overlap.terms[2].what.find("after the optimizer"), std::string::npos);
  EXPECT_DOUBLE_EQ(e.dp_overlap.terms[2].exposed, e.dp_overlap.terms[2].total);
  EXPECT_LT(e.dp_overlap.terms[1].exposed, e.dp_overlap.terms[1].total);
  EXPECT_NEAR(e.time.dp_hidden, e.dp_overlap.total() - e.dp_overlap.exposed(), 1e-12);
}

// ---- expressiveness ----

TEST(PlanExpressiveness, UnevenPipelineCutsAsTheRuntimeCuts) {
  const Cluster c = Cluster::from_text(kCluster);
  const Workload w = gpt(10, 64);
  Layout l = parse_layout("tp=2 pp=4 dp=1");
  ASSERT_EQ(layout_problem(w, l, c, Runtime::megatron, 8), "");
  // 10 layers over 4 stages, tessera's balanced cut (the head's cost leaves the last stage
  // fewer layers): the fullest stage holds 3.
  const StageLayers s = stage_layer_counts(w, l);
  EXPECT_EQ(s.most, 3);
  EXPECT_LE(s.last, 3);
  const std::vector<int64_t> sizes = pp::split_layers(w.cfg, 4, "balanced");
  EXPECT_EQ(s.first, double(sizes.front()));
  EXPECT_EQ(s.last, double(sizes.back()));
  // Stage parameters follow the cut: the first stage holds its layers and the embedding.
  const StageParams p = stage_params(w, l);
  const StageParams p1 = stage_params(gpt(4, 64), parse_layout("tp=2 pp=4 dp=1"));  // 1 each
  const double per_layer = stage_params(gpt(8, 64), l).first - p1.first;            // 2 layers vs 1
  EXPECT_NEAR(p.first - p1.first, (s.first - 1) * per_layer, 1e-6 * p.first);
  EXPECT_NEAR(p.last - p1.last, (s.last - 1) * per_layer, 1e-6 * p.last);
  // The pipeline runs at the fullest stage's pace: slower than an even 8-layer cut of 2.
  const Estimate e = estimate(w, l, c, Runtime::megatron);
  const Estimate even = estimate(gpt(8, 64), l, c, Runtime::megatron);
  EXPECT_GT(e.time.compute, even.time.compute);
}

TEST(PlanExpressiveness, PartialRecomputeLiesBetweenNoneAndFull) {
  const Cluster c = Cluster::from_text(kCluster);
  const Workload w = gpt(16, 64);
  const Layout none = parse_layout("tp=2 pp=2 dp=2 rc=none");
  const Layout half = parse_layout("tp=2 pp=2 dp=2 rc=full:4");
  const Layout full = parse_layout("tp=2 pp=2 dp=2 rc=full");
  EXPECT_EQ(half.recompute_layers, 4);
  EXPECT_NE(to_string(half).find("rc=full:4"), std::string::npos);
  ASSERT_EQ(layout_problem(w, half, c, Runtime::megatron, 8), "");
  const Estimate a = estimate(w, none, c, Runtime::megatron);
  const Estimate b = estimate(w, half, c, Runtime::megatron);
  const Estimate f = estimate(w, full, c, Runtime::megatron);
  EXPECT_LT(f.memory.activations, b.memory.activations);
  EXPECT_LT(b.memory.activations, a.memory.activations);
  // 4 of the stage's 8 layers recomputed: half of full recompute's extra work.
  EXPECT_NEAR(b.time.recompute, f.time.recompute / 2, 1e-12 * f.time.recompute);
  EXPECT_DOUBLE_EQ(a.time.recompute, 0);
  EXPECT_GT(b.hardware_flops_per_step, a.hardware_flops_per_step);
  EXPECT_LT(b.hardware_flops_per_step, f.hardware_flops_per_step);
  EXPECT_THROW(parse_layout("rc=full:0"), Error);
}

TEST(PlanExpressiveness, Zero3WithPipelineIsCosted) {
  const Cluster c = Cluster::from_text(kCluster);
  const Workload w = gpt(8, 64);
  const Layout z1 = parse_layout("tp=2 pp=2 dp=4 zero=1 mb=1");
  const Layout z3 = parse_layout("tp=2 pp=2 dp=4 zero=3 mb=1");
  ASSERT_EQ(layout_problem(w, z3, c, Runtime::megatron, 16), "");
  const Estimate a = estimate(w, z1, c, Runtime::megatron);
  const Estimate b = estimate(w, z3, c, Runtime::megatron);
  EXPECT_LT(b.memory.params, a.memory.params / 3);  // sharded over 4
  // Gathered every micro-batch: 16 micro-batches of traffic instead of one reduction.
  EXPECT_GT(b.time.dp_comm, 10 * a.time.dp_comm);
}

// ---- split-backward schedules under the Megatron-style runtime (doc/planning.md) ----

// (a) The bubble: zb-h1's (p-1)/(3m) is a third of 1f1b's (p-1)/m, which gpipe shares
// (Narayanan et al. 2021); at that bubble 1f1b holds p micro-batches where gpipe holds all m,
// and zb-h1 holds 1f1b's p plus the output gradients of the W's it defers.
TEST(PlanExpressiveness, MegatronSplitBackwardBubble) {
  const Cluster c = Cluster::from_text(kCluster);
  const Workload w = gpt(8, 64);
  Estimate e[3];
  const char* const scheds[3] = {"zb-h1", "1f1b", "gpipe"};
  for (int i = 0; i < 3; ++i) {
    const Layout l = parse_layout(std::string("tp=2 pp=4 dp=1 mb=1 sched=") + scheds[i]);
    ASSERT_EQ(layout_problem(w, l, c, Runtime::megatron, 8), "") << scheds[i];
    e[i] = estimate(w, l, c, Runtime::megatron);
  }
  const Estimate &zb = e[0], &f1b = e[1], &gp = e[2];
  EXPECT_EQ(zb.microbatches, 64);
  EXPECT_DOUBLE_EQ(zb.bubble_fraction, 3.0 / (3 * 64));
  EXPECT_DOUBLE_EQ(f1b.bubble_fraction, 3.0 / 64);
  EXPECT_NEAR(zb.time.pp_bubble, f1b.time.pp_bubble / 3, 1e-12 * f1b.time.pp_bubble);
  EXPECT_LT(zb.time.pp_bubble, f1b.time.pp_bubble);
  EXPECT_DOUBLE_EQ(f1b.time.pp_bubble, gp.time.pp_bubble);
  EXPECT_LT(zb.step_seconds, f1b.step_seconds);
  // The same work otherwise.
  EXPECT_DOUBLE_EQ(zb.time.compute, f1b.time.compute);
  EXPECT_DOUBLE_EQ(zb.time.tp_comm, f1b.time.tp_comm);
  // Memory: 1f1b < zb-h1 (the deferred W's output gradients) < gpipe (64 micro-batches).
  EXPECT_LT(f1b.memory.activations, zb.memory.activations);
  EXPECT_LT(zb.memory.activations, gp.memory.activations);
}

// (b) Activations held, by hand: gpt2, d_model 1024, 16 heads, seq 1024, vocab 128, 8 layers
// on p = 4 stages, bf16, FlashAttention, no dropout, m = 8 micro-batches of 1. Per layer and
// micro-batch (a = 2, T = 1024, C = q = k = 1024, F = 4096):
//   saved  A = a T C 4 + a T (q + 2k) + a T q + a T F 2 + 4 (16 heads x 1024 rows)
//            = 8388608 + 6291456 + 2097152 + 16777216 + 65536 = 33619968
//   W's output gradients  D = a T ((q + 2k) + C + F + C) = 2048 x 9216 = 18874368
// zb-v and dualpipev cut 8 chunks of one layer; stage 3 (layers 3 and 4, no embedding, no
// head) is the fuller: zb-v holds min(2p, 2m, m + p) = 8 chunks (1f1b's p x L/p = L layers'
// worth), 2 x 3 + 1 = 7 of them waiting for W; dualpipev 2p + 1 = 9 (DeepSeek's PP + 1 for
// DualPipeV's PP = 2p stages), 3 + 1 = 4 waiting; zb-h1 (2 layers a chunk) holds p = 4 on its
// last stage, all 4 waiting, with the head's stream and fp32 logits.
TEST(PlanExpressiveness, MegatronSplitBackwardActivationsByHand) {
  const Cluster c = Cluster::from_text(kCluster);
  Workload w = workload_from(
      plan_config("[model]\narch = gpt2\nvocab = 128\nseq_len = 1024\nlayers = 8\nd_model = 1024\n"
                  "heads = 16\n",
                  {"--train.global_batch=8"}, "test"));
  w.flash_attention = true;
  w.dropout = false;
  const double A = 33619968, D = 18874368;
  const double stream = 2.0 * 1024 * 1024, logits = 4.0 * 1024 * 128;
  const double layer = 12.0 * 1024 * 1024 + 13 * 1024;  // gpt2 block parameters
  struct Case {
    const char* layout;
    double activations;
  } cases[] = {
      {"pp=4 v=2 dp=1 mb=1 prec=bf16 sched=zb-v", 8 * A + 7 * D},
      {"pp=4 v=2 dp=1 mb=1 prec=bf16 sched=dualpipev", 9 * A + 4 * D},
      {"pp=4 dp=1 mb=1 prec=bf16 sched=zb-h1", 4 * 2 * A + 4 * 2 * D + stream + logits},
  };
  for (const Case& k : cases) {
    const Layout l = parse_layout(k.layout);
    ASSERT_EQ(layout_problem(w, l, c, Runtime::megatron, 4), "") << k.layout;
    const Estimate e = estimate(w, l, c, Runtime::megatron);
    EXPECT_EQ(e.microbatches, 8);
    EXPECT_DOUBLE_EQ(e.memory.activations, k.activations) << k.layout;
    // The reported stage holds 2 layers (and, for zb-h1, the final norm and the tied table's
    // copy for the head).
    const double head = l.schedule == PipeSchedule::zb_h1 ? 128.0 * 1024 + 2 * 1024 : 0;
    EXPECT_DOUBLE_EQ(e.params_per_rank, 2 * layer + head) << k.layout;
  }
  // A V's stage 0 holds the embedding and the head (the tied table once) with its 2 layers.
  const StageParams v = stage_params(w, parse_layout("pp=4 v=2 dp=1 mb=1 sched=dualpipev"));
  EXPECT_DOUBLE_EQ(v.first, 2 * layer + (128.0 + 1024) * 1024 + 2 * 1024);
  EXPECT_DOUBLE_EQ(v.last, v.first);
  EXPECT_DOUBLE_EQ(v.end, 2 * layer);
}

TEST(PlanExpressiveness, CausalAttentionHalvesFlashAttentionWork) {
  const Cluster c = Cluster::from_text(kCluster);
  Workload w = gpt(8, 64);
  w.flash_attention = true;
  const Layout l = parse_layout("tp=1 dp=8");
  Workload full = w;
  full.causal = false;
  const LayerCompute lc = layer_compute(w, l, c, false), lf = layer_compute(full, l, c, false);
  const double n = 2048.0 / 128;
  EXPECT_NEAR(lc.attn_fwd / lf.attn_fwd, (1 + 1 / n) / 2, 1e-12);
  // Materialised scores are computed in full whatever the mask.
  Workload mat = w;
  mat.flash_attention = false;
  EXPECT_DOUBLE_EQ(attention_work_fraction(mat), 1);
  // The MFU conventions: full T x T (Megatron-LM) and causal half.
  const double q = 4096;
  EXPECT_DOUBLE_EQ(
      workload_flops_per_token(w) - workload_flops_per_token(w, AttentionFlops::causal),
      6.0 * 8 * 2048 * q);
  const Estimate e = estimate(w, l, c, Runtime::megatron);
  EXPECT_LT(e.mfu_causal, e.mfu);
  EXPECT_GT(e.tokens_per_second, estimate(full, l, c, Runtime::megatron).tokens_per_second);
}

}  // namespace
}  // namespace tessera
