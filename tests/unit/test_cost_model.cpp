// The planner's formulas (src/perf/): collectives, activation memory (Korthikanti et al.),
// pipeline in-flight micro-batches and bubble, GEMM efficiency, FLOP accounting, cluster
// files, layouts, and the search's legality rules.
#include <gtest/gtest.h>

#include <cmath>

#include "../plan_cluster.hpp"
#include "core/error.hpp"
#include "perf/activation_memory.hpp"
#include "perf/cluster.hpp"
#include "perf/comm_model.hpp"
#include "perf/compute_model.hpp"
#include "perf/cost_model.hpp"
#include "perf/memory.hpp"
#include "plan/search.hpp"
#include "plan/workload.hpp"

namespace tessera {
namespace {

const char* const kCluster = test::kPlanCluster;

// A GPT-3-like model: h = 4096, 32 heads, seq 2048, 4h MLP.
Workload gpt(int64_t layers = 4, int64_t global_batch = 64) {
  Workload w = workload_from(plan_config(
      "[model]\narch = gpt2\nd_model = 4096\nheads = 32\nvocab = 51200\nseq_len = 2048\n",
      {"--model.layers=" + std::to_string(layers),
       "--train.global_batch=" + std::to_string(global_batch)},
      "test"));
  w.flash_attention = false;
  w.dropout = true;
  return w;
}

TEST(PlanCollectives, RingFormulas) {
  const Link link{1e9, 0, "x"};
  EXPECT_DOUBLE_EQ(all_reduce_seconds(1e9, 4, link), 2.0 * 3 / 4);
  EXPECT_DOUBLE_EQ(reduce_scatter_seconds(1e9, 4, link), 3.0 / 4);
  EXPECT_DOUBLE_EQ(all_gather_seconds(1e9, 4, link), 3.0 / 4);
  EXPECT_DOUBLE_EQ(all_reduce_seconds(1e9, 1, link), 0.0);
  const Link slow{1e9, 1e-3, "y"};
  EXPECT_DOUBLE_EQ(all_reduce_seconds(0.0, 8, slow), 0.0);
  EXPECT_NEAR(all_reduce_seconds(1e9, 8, slow), 2.0 * 7 / 8 + 14e-3, 1e-12);
  EXPECT_DOUBLE_EQ(p2p_seconds(2e9, slow), 2.0 + 1e-3);
}

TEST(PlanCollectives, Seed000TensorParallelVolume) {
  // Seed 000: one micro-batch of 1 x 4096 x 4096 bf16 activations is 32 MiB; a ring
  // all-reduce sends about twice that per card; 4 per layer, 32 layers: ~8 GiB.
  const double bytes = 1.0 * 4096 * 4096 * 2;
  const Link unit{1.0, 0, "bytes"};  // 1 byte/s: seconds == bytes sent per member
  const double per_allreduce = all_reduce_seconds(bytes, 1 << 20, unit);
  EXPECT_NEAR(per_allreduce / bytes, 2.0, 1e-5);
  EXPECT_NEAR(4 * 32 * per_allreduce / double(1ull << 30), 8.0, 1e-3);
}

TEST(PlanActivations, KorthikantiFormulas) {
  const Workload w = gpt();
  const double s = 2048, b = 1, h = 4096, a = 32;
  Layout l;
  l.micro_batch = 1;
  // No parallelism: s b h (34 + 5 a s / h).
  EXPECT_NEAR(layer_activations(w, l, false).total(), s * b * h * (34 + 5 * a * s / h), 1);
  // TP = 8: s b h (10 + 24/t + 5 a s / (h t)).
  l.tp = 8;
  EXPECT_NEAR(layer_activations(w, l, false).total(),
              s * b * h * (10 + 24.0 / 8 + 5 * a * s / (h * 8)), 1);
  // TP + SP: s b h (34/t + 5 a s/(h t)); selective recompute: s b h 34/t; full: 2 s b h / t.
  l.seq_parallel = true;
  const LayerActivations act = layer_activations(w, l, false);
  EXPECT_NEAR(act.total(), s * b * h * (34.0 / 8 + 5 * a * s / (h * 8)), 1);
  EXPECT_NEAR(saved_bytes_per_layer(act, Recompute::selective), s * b * h * 34.0 / 8, 1);
  EXPECT_NEAR(saved_bytes_per_layer(act, Recompute::full), 2 * s * b * h / 8, 1e-6);
  // FlashAttention keeps no scores, only 4-byte log-sum-exp rows.
  Workload flash = w;
  flash.flash_attention = true;
  EXPECT_EQ(layer_activations(flash, l, false).scores, 0.0);
}

TEST(PlanActivations, MicroBatchesInFlight) {
  Layout l;
  EXPECT_DOUBLE_EQ(inflight_layer_equivalents(l, 80, 64), 80);  // no pipeline: one
  l.pp = 4;
  EXPECT_DOUBLE_EQ(inflight_layer_equivalents(l, 80, 64), 80);  // 1F1B: p x L/p
  EXPECT_DOUBLE_EQ(inflight_layer_equivalents(l, 80, 2), 40);   // fewer than p micro-batches
  l.vpp = 5;                                                    // interleaved: L (1 + (p-1)/(p v))
  EXPECT_DOUBLE_EQ(inflight_layer_equivalents(l, 80, 64), 80 * (1 + 3.0 / 20));
  l.vpp = 1;
  l.schedule = PipeSchedule::gpipe;  // all m
  EXPECT_DOUBLE_EQ(inflight_layer_equivalents(l, 80, 64), 20.0 * 64);
}

TEST(PlanCompute, GemmEfficiencyAndRoofline) {
  const Cluster c = Cluster::from_text(kCluster);
  EXPECT_DOUBLE_EQ(gemm_efficiency(c, 1e4, 1e4, 100), 0.25);
  EXPECT_DOUBLE_EQ(gemm_efficiency(c, 1e4, 300, 1e4), 0.375);
  // Large square GEMM: compute bound at peak x efficiency.
  const double n = 8192, peak = c.peak(ComputeType::bf16);
  EXPECT_NEAR(gemm_seconds(c, peak, n, n, n), 2 * n * n * n / (peak * 0.5 * n / (n + 100)), 1e-12);
  // A thin GEMM whose operands dominate is bound by memory (on a slow-memory part).
  const Cluster slow =
      Cluster::from_text(std::string(kCluster) + "[accelerator]\nmemory_bw_gbs = 10\n");
  const double mem = (1e6 * 4 + 4 * 4 + 1e6 * 4) * 2 / slow.memory_bw;
  EXPECT_DOUBLE_EQ(gemm_seconds(slow, peak, 1e6, 4, 4), mem);
}

TEST(PlanCompute, MegatronFlopsWithFullRecompute) {
  // Narayanan et al. 2021: F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) per iteration with
  // full recompute; our hardware FLOPs must equal it.
  const Cluster c = Cluster::from_text(kCluster);
  const Workload w = gpt(8, 64);
  Layout l;
  l.dp = 8, l.tp = 2, l.pp = 2, l.recompute = Recompute::full;
  ASSERT_EQ(layout_problem(w, l, c, Runtime::megatron, 32), "");
  const Estimate e = estimate(w, l, c, Runtime::megatron);
  const double B = 64, s = 2048, L = 8, h = 4096, V = 51200;
  const double F = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h));
  EXPECT_NEAR(e.hardware_flops_per_step / F, 1.0, 1e-12);
  EXPECT_NEAR(
      e.model_flops_per_step / F,
      72.0 / 96 * (1 + s / (6 * h) + V / (12 * L * h)) / (1 + s / (6 * h) + V / (16 * L * h)),
      1e-12);
}

TEST(PlanCostModel, ExpertStateShardedOverDataParallelOverEp) {
  // The Megatron-style runtime holds a rank's E/ep experts and shards them over dp / ep ranks
  // (the dense state over dp), the rule tessera runs (doc/moe.md, "Expert memory";
  // moe_expert_memory checks tessera's side to the byte).
  const Cluster c = Cluster::from_text(kCluster);
  Workload w = gpt(4, 64);
  w.moe.experts = 8, w.moe.top_k = 2;
  for (int ep : {1, 2, 4, 8})
    for (int zero : {0, 1, 3}) {
      Layout l;
      l.dp = 8, l.ep = ep, l.zero = zero;
      const Estimate e = estimate(w, l, c, Runtime::megatron);
      const StageParams sp = stage_params(w, l);
      ASSERT_GT(sp.experts, 0);
      // The experts a rank holds: 4 layers x E/ep experts x 2 matrices of h x 4h.
      EXPECT_DOUBLE_EQ(sp.experts, 4.0 * (8 / ep) * 2 * 4096 * 4 * 4096);
      const ModelStateBytes d = zero_model_state(zero, sp.first - sp.experts, 8, l.mixed());
      const ModelStateBytes x = zero_model_state(zero, sp.experts, std::max(1, 8 / ep), l.mixed());
      EXPECT_DOUBLE_EQ(e.memory.params + e.memory.grads + e.memory.optimizer, d.total() + x.total())
          << "ep " << ep << " zero " << zero;
    }
}

TEST(PlanCostModel, BubbleAndStageParameters) {
  const Cluster c = Cluster::from_text(kCluster);
  const Workload w = gpt(8, 64);
  Layout l;
  l.dp = 2, l.tp = 2, l.pp = 4, l.vpp = 2;  // m = 64 / 2 = 32 micro-batches
  const Estimate e = estimate(w, l, c, Runtime::megatron);
  EXPECT_EQ(e.microbatches, 32);
  EXPECT_DOUBLE_EQ(e.bubble_fraction, 3.0 / (2 * 32));
  // Stage parameters add up to the model (tied embeddings: the last stage holds a copy).
  Layout one;
  const StageParams whole = stage_params(w, one);
  EXPECT_DOUBLE_EQ(whole.first, double(w.cfg.param_count()));
  Layout two;
  two.pp = 2;
  const StageParams halves = stage_params(w, two);
  const double copy = double(w.cfg.vocab_padded * w.cfg.d_model);
  EXPECT_DOUBLE_EQ(halves.first + halves.last, double(w.cfg.param_count()) + copy);
}

TEST(PlanCostModel, DataParallelTrafficPerStage) {
  Layout l;
  l.dp = 4;
  GroupLinks g;
  g.dp = g.shard = g.replica = Link{1.0, 0, "unit"};
  l.precision = ComputeType::bf16;
  EXPECT_DOUBLE_EQ(dp_comm(l, g, 100, 1).bytes, 2.0 * 3 / 4 * 2 * 100);  // all-reduce 2 Psi
  l.zero = 1;
  EXPECT_DOUBLE_EQ(dp_comm(l, g, 100, 1).bytes, 3.0 / 4 * 4 * 100);  // RS + AG: same
  l.zero = 3;
  EXPECT_DOUBLE_EQ(dp_comm(l, g, 100, 2).bytes, 3.0 / 4 * 2 * (2 * 2 + 2) * 100);
}

TEST(PlanCluster, ParsesAndClassifiesLinks) {
  const Cluster c = Cluster::from_text(kCluster);
  EXPECT_EQ(c.per_node, 8);
  EXPECT_DOUBLE_EQ(c.memory, 80e9);
  EXPECT_DOUBLE_EQ(c.pod.bw, 5e9);
  EXPECT_STREQ(c.link(8, 1).name, "intra-node");   // TP 8 on one node
  EXPECT_STREQ(c.link(16, 1).name, "inter-node");  // TP 16 spans two
  EXPECT_STREQ(c.link(4, 8).name, "inter-node");   // PP 4 across nodes
  EXPECT_STREQ(c.link(8, 8).name, "inter-pod");    // 64 ranks > a pod of 32
  EXPECT_THROW(c.peak(ComputeType::fp8), Error);
  EXPECT_THROW(Cluster::from_text("[node]\nacelerators = 8\n"), Error);
  try {
    Cluster::from_text("[accelerator]\npeak_bf16_tflops = 1\n[node]\nbw_gb = 3\n");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'node.bw_gbs'"), std::string::npos);
  }
}

TEST(PlanLayout, ParsesAndPrints) {
  const Layout l = parse_layout("tp=8, pp=4 dp=2 v=2 zero=1 mb=2 sp=1 rc=selective prec=fp16");
  EXPECT_EQ(l.tp, 8);
  EXPECT_EQ(l.pp, 4);
  EXPECT_EQ(l.vpp, 2);
  EXPECT_EQ(l.recompute, Recompute::selective);
  EXPECT_EQ(l.precision, ComputeType::fp16);
  EXPECT_EQ(parse_layout(to_string(l)), l);
  EXPECT_THROW(parse_layout("tp=8 foo=1"), Error);
  EXPECT_THROW(parse_layout("rc=partial"), Error);
}

// Context parallelism per layer: the ring sends (cp - 1) K/V blocks in forward and twice
// that in backward; tessera's Ulysses does 4 all-to-alls forward and 8 backward (4 more with
// recompute), each of what one rank holds of q, k, v or the output.
TEST(PlanCollectives, ContextParallelRingAndUlysses) {
  const Link link{1e9, 0, "x"};
  Workload w = gpt(4, 64);  // 32 heads of 128, seq_len 2048, fp32 activations
  Layout l;
  l.cp = 4, l.micro_batch = 1;
  const double a = activation_element_bytes(l), T = 2048.0 / 4, hd = 32.0 * 128;
  EXPECT_DOUBLE_EQ(cp_seconds_per_layer(w, l, link), 3 * 3 * (2 * a * T * hd / 1e9));
  w.cp_kind = CpKind::ulysses;
  const double one = all_to_all_seconds(a * T * hd, 4, link);  // q, k, v and out alike here
  EXPECT_DOUBLE_EQ(cp_seconds_per_layer(w, l, link), 12 * one);
  l.recompute = Recompute::selective;
  EXPECT_DOUBLE_EQ(cp_seconds_per_layer(w, l, link), 16 * one);
}

TEST(PlanSearch, LegalityRules) {
  const Cluster c = Cluster::from_text(kCluster);
  const Workload w = gpt(8, 64);
  Layout l;
  l.dp = 8, l.tp = 3;
  EXPECT_NE(layout_problem(w, l, c, Runtime::megatron, 24).find("does not divide the 32 heads"),
            std::string::npos);
  // Layers that do not divide into stages are cut unevenly (tessera's balanced cut); a
  // chunk without layers is illegal.
  l.tp = 2, l.dp = 2, l.pp = 3;
  EXPECT_EQ(layout_problem(w, l, c, Runtime::megatron, 12), "");
  l.tp = 1, l.dp = 1, l.pp = 12;
  EXPECT_NE(layout_problem(w, l, c, Runtime::megatron, 12).find("without layers"),
            std::string::npos);
  l.tp = 2, l.dp = 2;
  l.pp = 2, l.zero = 2;  // ZeRO-2/3 with a pipeline are costed, not refused
  EXPECT_EQ(layout_problem(w, l, c, Runtime::megatron, 8), "");
  l.zero = 0, l.micro_batch = 3;
  EXPECT_NE(layout_problem(w, l, c, Runtime::megatron, 8).find("not a multiple"),
            std::string::npos);
  l.micro_batch = 1;
  EXPECT_EQ(layout_problem(w, l, c, Runtime::megatron, 8), "");
  // tessera runs pipelines (with ZeRO-2/3 too, and layers that do not split evenly) and CP.
  l.precision = ComputeType::fp32;
  EXPECT_EQ(layout_problem(w, l, c, Runtime::tessera, 8), "");
  l.zero = 2;
  EXPECT_EQ(layout_problem(w, l, c, Runtime::tessera, 8), "");
  l.zero = 0, l.pp = 3, l.dp = 1, l.tp = 4;
  EXPECT_EQ(layout_problem(w, l, c, Runtime::tessera, 12), "");
  l.pp = 2, l.vpp = 8;
  EXPECT_NE(layout_problem(w, l, c, Runtime::tessera, 8).find("without layers"),
            std::string::npos);
  // Context parallelism: the ring needs seq_len divisible by 2 cp, Ulysses cp dividing the
  // heads and key/value heads per tensor-parallel rank (parallel.cp_kind).
  l.vpp = 1, l.tp = 2, l.cp = 2;
  EXPECT_EQ(layout_problem(w, l, c, Runtime::tessera, 8), "");
  Workload odd = w;
  odd.cfg.seq_len = 2046;
  EXPECT_NE(layout_problem(odd, l, c, Runtime::tessera, 8).find("zigzag chunks"),
            std::string::npos);
  Workload uly = w;
  uly.cp_kind = CpKind::ulysses;
  EXPECT_EQ(layout_problem(uly, l, c, Runtime::tessera, 8), "");
  uly.cfg.heads = uly.cfg.kv_heads = 6;  // 3 per tensor-parallel rank
  // tessera's own error text (RankLayout::make), as a run of this layout would print it.
  EXPECT_NE(layout_problem(uly, l, c, Runtime::tessera, 8).find("with cp_kind = ulysses gives"),
            std::string::npos);
  EXPECT_EQ(divisors(12), (std::vector<int>{1, 2, 3, 4, 6, 12}));
}

// tessera's precisions: bf16 and fp16 are costed, fp8 is not; grad=bf16 (its
// parallel.grad_reduce_dtype) halves the data-parallel all-reduce and ZeRO's reduce-scatters;
// tessera's reductions move fp32 in every precision otherwise, and its gathers too except
// ZeRO-3's in bf16 (the 16-bit copy of the shard).
TEST(PlanTessera, PrecisionAndGradientReductionDtype) {
  const Cluster c = Cluster::from_text(kCluster);
  const Workload w = gpt(8, 64);
  Layout l = parse_layout("dp=8 zero=0 mb=1 prec=bf16");
  EXPECT_EQ(layout_problem(w, l, c, Runtime::tessera, 8), "");
  const Estimate fp32_grads = estimate(w, l, c, Runtime::tessera);
  l = parse_layout("dp=8 zero=0 mb=1 prec=bf16 grad=bf16");
  EXPECT_NE(to_string(l).find("grad=bf16"), std::string::npos);
  const Estimate bf16_grads = estimate(w, l, c, Runtime::tessera);
  EXPECT_NEAR(bf16_grads.dp_overlap.total(), 0.5 * fp32_grads.dp_overlap.total(),
              0.05 * fp32_grads.dp_overlap.total());
  EXPECT_GT(bf16_grads.memory.comm, fp32_grads.memory.comm);  // the bf16 staging copy
  for (int zero : {1, 2, 3}) {
    Layout a = parse_layout("dp=8 zero=" + std::to_string(zero) + " mb=1 prec=bf16");
    Layout b = a;
    b.grad_bytes = 2;
    EXPECT_EQ(layout_problem(w, b, c, Runtime::tessera, 8), "") << zero;
    const Estimate ea = estimate(w, a, c, Runtime::tessera), eb = estimate(w, b, c, Runtime::tessera);
    EXPECT_LT(eb.dp_overlap.total(), ea.dp_overlap.total()) << zero;
    // Stage 1 reduces from the full gradient buffer in fp32 and needs 16-bit staging in bf16;
    // stages 2-3 stage their gradients in fp32 either way, and the 16-bit copy and piece
    // replace the fp32 piece (plan_validate_tessera checks the bytes against a run).
    if (zero == 1) EXPECT_GT(eb.memory.comm, ea.memory.comm);
    else EXPECT_LT(eb.memory.comm, ea.memory.comm) << zero;
  }
  Layout z3 = parse_layout("dp=8 zero=3 mb=1 prec=fp32");
  const Estimate gather32 = estimate(w, z3, c, Runtime::tessera);
  z3.precision = ComputeType::bf16;
  EXPECT_LT(estimate(w, z3, c, Runtime::tessera).dp_overlap.total(), gather32.dp_overlap.total());
  l = parse_layout("dp=8 zero=0 mb=1 prec=fp8");
  EXPECT_NE(layout_problem(w, l, c, Runtime::tessera, 8).find("fp32, bf16 or fp16"),
            std::string::npos);
}

TEST(PlanSearch, RanksByThroughputAndExplainsRejections) {
  const Cluster c = Cluster::from_text(kCluster);
  const Workload w = gpt(8, 64);
  const SearchResult r = search(w, c, 32, Runtime::megatron, SearchSpace{});
  ASSERT_FALSE(r.accepted.empty());
  for (size_t i = 1; i < r.accepted.size(); ++i)
    EXPECT_GE(r.accepted[i - 1].tokens_per_second, r.accepted[i].tokens_per_second);
  for (const Estimate& e : r.accepted) {
    EXPECT_TRUE(e.fits());
    EXPECT_LE(e.layout.tp, 8);
  }
  bool tp16 = false;
  for (const FamilyRejection& f : r.rejected)
    if (f.family.rfind("tp=16 ", 0) == 0) {
      tp16 = true;
      EXPECT_EQ(f.tp_across_nodes, f.layouts - f.illegal);
      EXPECT_NE(f.summary().find("TP across nodes"), std::string::npos);
    }
  EXPECT_TRUE(tp16);
}

}  // namespace
}  // namespace tessera
