// Pipeline schedules as data (parallel/pp/schedule.hpp, doc/pipeline.md): every allowed
// shape up to p = 8, m = 16, v = 4 (the split-backward kinds: and m up to 8p) is complete,
// ordered, paired, deadlock-free, has the documented bubble and peak activations; bad shapes
// are collective errors; the checker rejects broken schedules.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "parallel/pp/schedule.hpp"
#include "parallel/pp/schedule_check.hpp"

namespace tessera::pp {
namespace {

using K = PipeSchedule;

constexpr PipeSchedule kFusedKinds[] = {K::gpipe, K::one_f_one_b, K::interleaved};
constexpr PipeSchedule kSplitKinds[] = {K::zb_h1, K::zb_v, K::dualpipe_v};
constexpr PipeSchedule kAllKinds[] = {K::gpipe, K::one_f_one_b, K::interleaved,
                                      K::zb_h1, K::zb_v,        K::dualpipe_v};

bool allowed(const ScheduleShape& shape) {
  try {
    require_valid(shape);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// Every allowed shape of one kind with p <= 8, m <= 16, v <= 4; for the split kinds also m
// = p, p + 1, 2p, 2p + 1, 3p, 4p and 8p.
std::vector<ScheduleShape> all_shapes(PipeSchedule kind) {
  std::vector<ScheduleShape> shapes;
  for (int p = 1; p <= 8; ++p) {
    std::set<int> ms;
    for (int m = 1; m <= 16; ++m) ms.insert(m);
    if (splits_backward(kind)) ms.insert({p, p + 1, 2 * p, 2 * p + 1, 3 * p, 4 * p, 8 * p});
    for (int m : ms) {
      for (int v = 1; v <= 4; ++v) {
        const ScheduleShape shape{p, m, v, kind};
        if (allowed(shape)) shapes.push_back(shape);
      }
    }
  }
  return shapes;
}

std::string name(const ScheduleShape& s) {
  return cat(to_string(s.kind), " p=", s.stages, " m=", s.micro_batches, " v=", s.chunks);
}

std::string join(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& line : lines) out += line + "\n";
  return out;
}

// The ideal costs each shape is simulated with: forward, backward_input, backward_weight
// (a fused backward costs the last two together: 2, 1, 3, 3 and 3).
constexpr OpCosts kCosts[] = {{1, 1, 1}, {1, 1, 0}, {2, 2, 1}, {1, 2, 1}, {2, 2, 2}, {2, 1, 2}};

// The properties issue 6 asks for (issue 33: with split backwards), checked here without
// trusting check_schedule alone.
void expect_correct(const ScheduleShape& shape) {
  SCOPED_TRACE(name(shape));
  const Schedule sched = make_schedule(shape);
  ASSERT_EQ(int(sched.stages.size()), shape.stages);
  const std::vector<std::string> problems = check_schedule(sched);
  ASSERT_TRUE(problems.empty()) << join(problems);

  // Each (micro-batch, local chunk) forward and backward exactly once per stage (split: its
  // backward_input and backward_weight, and no fused backward); sends and recvs per
  // direction: one per micro-batch per boundary between two stages in all.
  const int p = shape.stages, m = shape.micro_batches, v = shape.chunks, C = shape.model_chunks();
  const bool split = shape.split_backward();
  std::map<Op::Kind, int> total;
  for (int s = 0; s < p; ++s) {
    std::map<Op::Kind, std::set<std::pair<int, int>>> passes;
    int forwards = 0;
    bool backward_seen = false;
    for (const Op& op : sched.stages[s]) {
      ++total[op.kind];
      if (op.is_compute()) EXPECT_TRUE(passes[op.kind].insert({op.micro, op.chunk}).second);
      if (op.computes_input_grad()) backward_seen = true;
      if (op.kind == Op::forward && !backward_seen) ++forwards;
    }
    EXPECT_EQ(int(passes[Op::forward].size()), m * v);
    EXPECT_EQ(int(passes[Op::backward].size()), split ? 0 : m * v);
    EXPECT_EQ(int(passes[Op::backward_input].size()), split ? m * v : 0);
    EXPECT_EQ(int(passes[Op::backward_weight].size()), split ? m * v : 0);
    EXPECT_EQ(forwards, std::min(warmup_forwards(shape, s) + 1, m * v)) << "stage " << s;
  }
  int crossing = 0;
  for (int b = 0; b + 1 < C; ++b) crossing += shape.crosses(b);
  EXPECT_EQ(crossing, shape.placement() == Placement::v_shape ? C - 2 : C - 1);
  for (Op::Kind k : {Op::send_act, Op::recv_act, Op::send_grad, Op::recv_grad}) {
    EXPECT_EQ(total[k], m * crossing) << to_string(k);
  }

  // Tags: distinct for every message of a step, below 2 m (C - 1).
  std::set<int> tags;
  for (int s = 0; s < p; ++s) {
    for (const Op& op : sched.stages[s]) {
      if (!op.is_send()) continue;
      const int tag = message_tag(shape, message_of(shape, s, op));
      EXPECT_TRUE(tags.insert(tag).second) << tag;
      EXPECT_GE(tag, 0);
      EXPECT_LT(tag, 2 * m * (C - 1));
    }
  }

  // The ideal-time simulation: dependency order in time, and the bubble, for several costs.
  for (const OpCosts& costs : kCosts) {
    SCOPED_TRACE(cat("F ", costs.forward, " B ", costs.input, " W ", costs.weight));
    const Simulation sim = simulate(sched, costs);
    // [micro][model chunk] -> interval: forward, the input gradient's pass (backward or
    // backward_input), backward_weight.
    std::vector<std::vector<Interval>> f(m, std::vector<Interval>(C)), b(f), w(f);
    for (int s = 0; s < p; ++s) {
      for (const Interval& iv : sim.timeline[s]) {
        const int c = shape.model_chunk(s, iv.op.chunk);
        auto& at = iv.op.kind == Op::forward ? f : iv.op.kind == Op::backward_weight ? w : b;
        at[iv.op.micro][c] = iv;
      }
    }
    for (int i = 0; i < m; ++i) {
      for (int c = 0; c < C; ++c) {
        EXPECT_LE(f[i][c].end, b[i][c].begin) << i << " " << c;
        if (split) EXPECT_LE(b[i][c].end, w[i][c].begin) << i << " " << c;
        if (c + 1 < C) {
          EXPECT_LE(f[i][c].end, f[i][c + 1].begin) << i << " " << c;
          EXPECT_LE(b[i][c + 1].end, b[i][c].begin) << i << " " << c;
        }
      }
    }
    const std::int64_t F = costs.forward, B = costs.input, W = costs.weight;
    EXPECT_EQ(sim.compute, std::int64_t(m) * v * (F + B + W));
    // bubble = (makespan - compute) / compute, exactly (the V kinds: at F = B = W; for
    // other costs at least the ramp of the first forward, (p-1) F).
    const std::int64_t idle = sim.makespan - sim.compute;
    switch (shape.kind) {
      case K::gpipe:
      case K::one_f_one_b:
      case K::interleaved:  // F, B, W of a chunk, 1/v of a stage: (p-1)/(v m) of v m passes
        EXPECT_EQ(idle, (p - 1) * (F + B + W));
        break;
      case K::zb_h1:
        EXPECT_EQ(idle, (p - 1) * std::max({F, B, F + B - W}));
        break;
      case K::zb_v:
      case K::dualpipe_v:
        EXPECT_GE(idle, (p - 1) * F);
        if (F == B && B == W) {
          EXPECT_EQ(idle, F * (shape.kind == K::zb_v ? std::max(p - 1, 4 * p - 2 - 2 * m) : p - 1));
        }
        break;
    }
    if (shape.placement() == Placement::round_robin || (F == B && B == W)) {
      EXPECT_EQ(sim.bubble, bubble_formula(shape, costs));
    }
  }

  // Peak activations held per stage, in chunk activations.
  const std::vector<int> peak = peak_activations(sched);
  for (int s = 0; s < p; ++s) {
    EXPECT_EQ(peak[s], peak_activations_formula(shape, s)) << "stage " << s;
    switch (shape.kind) {
      case K::gpipe:
        EXPECT_EQ(peak[s], m);
        break;
      case K::one_f_one_b:
        EXPECT_EQ(peak[s], std::min(p - s, m));
        EXPECT_LE(peak[s], p);
        break;
      case K::interleaved:
        EXPECT_EQ(peak[s], std::min(2 * (p - s - 1) + (v - 1) * p + 1, v * m));
        break;
      case K::zb_h1:  // 1f1b's first stage's, on every stage
        EXPECT_EQ(peak[s], p);
        break;
      case K::zb_v:  // 2p chunks: 1f1b's p stage activations
        EXPECT_EQ(peak[s], std::min({2 * p, 2 * m, m + s + 1}));
        EXPECT_LE(peak[s], 2 * p);
        break;
      case K::dualpipe_v:
        EXPECT_EQ(peak[s], 2 * p + 1);
        break;
    }
  }

  // Peak passes between B and W per stage (their output gradients wait for W).
  const std::vector<int> pending = peak_pending_weights(sched);
  for (int s = 0; s < p; ++s) {
    if (shape.kind == K::zb_v && m < 2 * p - 1)
      EXPECT_LE(pending[s], peak_pending_weights_formula(shape, s)) << "stage " << s;
    else
      EXPECT_EQ(pending[s], peak_pending_weights_formula(shape, s)) << "stage " << s;
    EXPECT_LE(pending[s], peak[s]) << "stage " << s;
  }
}

TEST(PipelineSchedule, EveryGPipeShape) {
  const auto shapes = all_shapes(K::gpipe);
  EXPECT_EQ(shapes.size(), 8u * 16u);
  for (const ScheduleShape& shape : shapes) expect_correct(shape);
}

TEST(PipelineSchedule, Every1F1BShape) {
  const auto shapes = all_shapes(K::one_f_one_b);
  EXPECT_EQ(shapes.size(), 100u);  // sum over p = 1..8 of (17 - p)
  for (const ScheduleShape& shape : shapes) expect_correct(shape);
}

TEST(PipelineSchedule, EveryInterleavedShape) {
  const auto shapes = all_shapes(K::interleaved);
  // p = 2..8 with m a multiple of p: 8 + 5 + 4 + 3 + 2 + 2 + 2 = 26, times v = 2, 3, 4.
  EXPECT_EQ(shapes.size(), 78u);
  for (const ScheduleShape& shape : shapes) expect_correct(shape);
}

// The number of m in 1..16 and in {p, p+1, 2p, 2p+1, 3p, 4p, 8p} from `least` on.
std::size_t micro_batch_counts(int p, int least) {
  std::set<int> ms;
  for (int m = std::max(1, least); m <= 16; ++m) ms.insert(m);
  for (int m : {p, p + 1, 2 * p, 2 * p + 1, 3 * p, 4 * p, 8 * p})
    if (m >= least) ms.insert(m);
  return ms.size();
}

TEST(PipelineSchedule, EveryZbH1Shape) {
  const auto shapes = all_shapes(K::zb_h1);
  std::size_t want = 0;
  for (int p = 1; p <= 8; ++p) want += micro_batch_counts(p, p);  // v = 1, m >= p
  EXPECT_EQ(shapes.size(), want);
  for (const ScheduleShape& shape : shapes) expect_correct(shape);
}

TEST(PipelineSchedule, EveryZbVShape) {
  const auto shapes = all_shapes(K::zb_v);
  std::size_t want = 0;
  for (int p = 1; p <= 8; ++p) want += micro_batch_counts(p, 1);  // v = 2, any m
  EXPECT_EQ(shapes.size(), want);
  for (const ScheduleShape& shape : shapes) expect_correct(shape);
}

TEST(PipelineSchedule, EveryDualPipeVShape) {
  const auto shapes = all_shapes(K::dualpipe_v);
  std::size_t want = 0;
  for (int p = 1; p <= 8; ++p) want += micro_batch_counts(p, 2 * p);  // v = 2, m >= 2p
  EXPECT_EQ(shapes.size(), want);
  for (const ScheduleShape& shape : shapes) expect_correct(shape);
}

// One stage: forward then backward per micro-batch, nothing sent (doc/architecture.md, "The
// one step loop").
TEST(PipelineSchedule, OneStageIsForwardThenBackward) {
  const Schedule s = make_schedule(1, 3, 1, PipeSchedule::one_f_one_b);
  const std::vector<Op> want = {{Op::forward, 0, 0, -1}, {Op::backward, 0, 0, -1},
                                {Op::forward, 1, 0, -1}, {Op::backward, 1, 0, -1},
                                {Op::forward, 2, 0, -1}, {Op::backward, 2, 0, -1}};
  EXPECT_EQ(s.stages[0], want);
}

// The op-list format, written out for 1f1b with p = 2, m = 3.
TEST(PipelineSchedule, OneFOneBOpList) {
  const Schedule s = make_schedule(2, 3, 1, PipeSchedule::one_f_one_b);
  const std::vector<Op> stage0 = {
      {Op::forward, 0, 0, -1},  {Op::send_act, 0, 0, 1},    // warm-up: p - 0 - 1 = 1
      {Op::forward, 1, 0, -1},  {Op::send_act, 1, 0, 1},    // steady: F1 B0
      {Op::recv_grad, 0, 0, 1}, {Op::backward, 0, 0, -1},   //
      {Op::forward, 2, 0, -1},  {Op::send_act, 2, 0, 1},    // F2 B1
      {Op::recv_grad, 1, 0, 1}, {Op::backward, 1, 0, -1},   //
      {Op::recv_grad, 2, 0, 1}, {Op::backward, 2, 0, -1}};  // cool-down: B2
  const std::vector<Op> stage1 = {
      {Op::recv_act, 0, 0, 0},  {Op::forward, 0, 0, -1},  {Op::backward, 0, 0, -1},
      {Op::send_grad, 0, 0, 0}, {Op::recv_act, 1, 0, 0},  {Op::forward, 1, 0, -1},
      {Op::backward, 1, 0, -1}, {Op::send_grad, 1, 0, 0}, {Op::recv_act, 2, 0, 0},
      {Op::forward, 2, 0, -1},  {Op::backward, 2, 0, -1}, {Op::send_grad, 2, 0, 0}};
  EXPECT_EQ(s.stages[0], stage0);
  EXPECT_EQ(s.stages[1], stage1);
}

std::string compute_order(const std::vector<Op>& ops) {
  std::string out;
  for (const Op& op : ops) {
    if (!op.is_compute()) continue;
    const char* letter = op.kind == Op::forward ? "F" : op.kind == Op::backward_weight ? "W" : "B";
    out += cat(letter, op.micro, char('a' + op.chunk), " ");
  }
  return out;
}

// Megatron-LM's order: micro-batches go through the chunks in groups of p (forwards chunk
// a then b, backwards b then a); warm-up 2 (p - s - 1) + (v - 1) p.
TEST(PipelineSchedule, InterleavedOrder) {
  const Schedule s = make_schedule(2, 4, 2, PipeSchedule::interleaved);
  EXPECT_EQ(warmup_forwards(s.shape, 0), 4);
  EXPECT_EQ(warmup_forwards(s.shape, 1), 2);
  EXPECT_EQ(compute_order(s.stages[0]),
            "F0a F1a F0b F1b F2a B0b F3a B1b F2b B0a F3b B1a B2b B3b B2a B3a ");
  EXPECT_EQ(compute_order(s.stages[1]),
            "F0a F1a F0b B0b F1b B1b F2a B0a F3a B1a F2b B2b F3b B3b B2a B3a ");
  // Model chunk 1 (stage 1, local chunk 0) sends to model chunk 2 (stage 0, local chunk 1).
  EXPECT_EQ(s.stages[1][2], (Op{Op::send_act, 0, 0, 0}));
  EXPECT_EQ(message_of(s.shape, 1, s.stages[1][2]), (Message{1, 0, 0, 1, false}));
}

TEST(PipelineSchedule, GPipeIsAllForwardsThenAllBackwards) {
  const Schedule s = make_schedule(3, 4, 1, PipeSchedule::gpipe);
  for (int st = 0; st < 3; ++st) {
    EXPECT_EQ(compute_order(s.stages[st]), "F0a F1a F2a F3a B0a B1a B2a B3a ");
  }
}

// The split op list, written out for zb-h1 with p = 2, m = 3: 1f1b's forwards and
// backward_inputs, each backward_weight after the backward_input s places later (stage 1
// holds one back, stage 0 none), the held-back ones at the end.
TEST(PipelineSchedule, ZbH1OpList) {
  const Schedule s = make_schedule(2, 3, 1, K::zb_h1);
  const auto F = Op::forward, B = Op::backward_input, W = Op::backward_weight;
  const std::vector<Op> stage0 = {
      {F, 0, 0, -1},  {Op::send_act, 0, 0, 1},                                  // warm-up
      {F, 1, 0, -1},  {Op::send_act, 1, 0, 1},  {Op::recv_grad, 0, 0, 1},       // F1 B0 W0
      {B, 0, 0, -1},  {W, 0, 0, -1},                                            //
      {F, 2, 0, -1},  {Op::send_act, 2, 0, 1},  {Op::recv_grad, 1, 0, 1},       // F2 B1 W1
      {B, 1, 0, -1},  {W, 1, 0, -1},                                            //
      {Op::recv_grad, 2, 0, 1}, {B, 2, 0, -1},  {W, 2, 0, -1}};                 // B2 W2
  const std::vector<Op> stage1 = {
      {Op::recv_act, 0, 0, 0}, {F, 0, 0, -1}, {B, 0, 0, -1}, {Op::send_grad, 0, 0, 0},  // F0 B0
      {Op::recv_act, 1, 0, 0}, {F, 1, 0, -1}, {B, 1, 0, -1}, {Op::send_grad, 1, 0, 0},  // F1 B1
      {W, 0, 0, -1},                                                                    // W0
      {Op::recv_act, 2, 0, 0}, {F, 2, 0, -1}, {B, 2, 0, -1}, {Op::send_grad, 2, 0, 0},  // F2 B2
      {W, 1, 0, -1},           {W, 2, 0, -1}};                                          // W1 W2
  EXPECT_EQ(s.stages[0], stage0);
  EXPECT_EQ(s.stages[1], stage1);
  EXPECT_EQ(compute_order(s.stages[1]), "F0a B0a F1a B1a W0a F2a B2a W1a W2a ");
}

// The V placement: model chunk c on stage c going down, on stage 2p-1-c coming back up.
TEST(PipelineSchedule, VPlacement) {
  const ScheduleShape v{4, 8, 2, K::zb_v}, rr{4, 8, 2, K::interleaved};
  EXPECT_EQ(v.placement(), Placement::v_shape);
  EXPECT_EQ(ScheduleShape({4, 8, 2, K::dualpipe_v}).placement(), Placement::v_shape);
  EXPECT_EQ(rr.placement(), Placement::round_robin);
  EXPECT_EQ(ScheduleShape({4, 8, 1, K::zb_h1}).placement(), Placement::round_robin);
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(v.stage_of(c), c < 4 ? c : 7 - c) << c;
    EXPECT_EQ(v.local_chunk_of(c), c < 4 ? 0 : 1) << c;
    EXPECT_EQ(v.model_chunk(v.stage_of(c), v.local_chunk_of(c)), c);
    EXPECT_EQ(rr.stage_of(c), c % 4) << c;
    EXPECT_EQ(rr.model_chunk(rr.stage_of(c), rr.local_chunk_of(c)), c);
  }
  for (int b = 0; b < 7; ++b) {
    EXPECT_EQ(v.crosses(b), b != 3) << b;  // chunks 3 and 4 are both stage 3's
    EXPECT_TRUE(rr.crosses(b)) << b;
  }
  EXPECT_EQ(v.loss_stage(), 0);
  EXPECT_EQ(rr.loss_stage(), 3);
  // Stage 3 runs chunk 4's forward after chunk 3's with no message between them, and
  // chunk 3's backward after chunk 4's.
  const Schedule s = make_schedule(v);
  for (const Op& op : s.stages[3]) {
    EXPECT_FALSE((op.kind == Op::send_act || op.kind == Op::recv_grad) && op.chunk == 0);
    EXPECT_FALSE((op.kind == Op::recv_act || op.kind == Op::send_grad) && op.chunk == 1);
  }
  EXPECT_EQ(compute_order(s.stages[3]).substr(0, 12), "F0a F0b F1a ");
}

// zb-v in PyTorch's ZB-V order, dualpipev in DeepSeek's DualPipeV order, for p = 2 (a: the
// local chunk going down, b: coming back up; stage 0's b ends in the loss).
TEST(PipelineSchedule, VOrders) {
  Schedule s = make_schedule(2, 4, 2, K::zb_v);
  EXPECT_EQ(compute_order(s.stages[0]),
            "F0a F1a F2a F0b B0b W0b F1b B1b W1b F3a B0a W0a F2b B2b W2b B1a W1a F3b B3b W3b "
            "B2a W2a B3a W3a ");
  EXPECT_EQ(compute_order(s.stages[1]),
            "F0a F0b F1a F1b B0b W0b F2a B0a W0a F2b B1b W1b F3a B1a W1a F3b B2b W2b B2a B3b "
            "B3a W2a W3b W3a ");
  s = make_schedule(2, 4, 2, K::dualpipe_v);
  EXPECT_EQ(compute_order(s.stages[0]),
            "F0a F1a F2a F0b B0b W0b F1b F3a B1b W1b F2b B0a W0a B2b W2b F3b B1a W1a B3b W3b "
            "B2a W2a B3a W3a ");
  EXPECT_EQ(compute_order(s.stages[1]),
            "F0a F0b F1a F1b F2a B0b W0b F2b B0a W0a F3a B1b W1b F3b B1a W1a B2b W2b B2a W2a "
            "B3b B3a W3b W3a ");
  // Fewer micro-batches than 2p - 1: zb-v's order for 3, without micro-batch 2.
  s = make_schedule(2, 2, 2, K::zb_v);
  EXPECT_EQ(compute_order(s.stages[0]), "F0a F1a F0b B0b W0b F1b B1b W1b B0a W0a B1a W1a ");
}

// At F = B = W (a backward twice a forward, split in halves) zb-h1's bubble is a third of
// 1f1b's, zb-v's and dualpipev's a sixth: only the ramp of the first forward down the stages
// ((p-1) chunk forwards, half a stage's each), which no schedule avoids.
TEST(PipelineSchedule, SplitBackwardBubbles) {
  for (int p = 2; p <= 8; ++p) {
    for (int m : {2 * p, 2 * p + 1, 3 * p, 4 * p, 8 * p}) {
      SCOPED_TRACE(cat("p ", p, " m ", m));
      const Ratio one = simulate(make_schedule(p, m, 1, K::one_f_one_b)).bubble;
      EXPECT_EQ(one, make_ratio(p - 1, m));
      EXPECT_EQ(simulate(make_schedule(p, m, 1, K::zb_h1)).bubble, make_ratio(p - 1, 3 * m));
      EXPECT_EQ(simulate(make_schedule(p, m, 2, K::zb_v)).bubble, make_ratio(p - 1, 6 * m));
      EXPECT_EQ(simulate(make_schedule(p, m, 2, K::dualpipe_v)).bubble, make_ratio(p - 1, 6 * m));
    }
  }
  // zb-v below m = 3p/2: the dropped padding leaves gaps, max(p-1, 4p-2-2m) / (6m).
  EXPECT_EQ(simulate(make_schedule(4, 4, 2, K::zb_v)).bubble, make_ratio(6, 24));
  EXPECT_EQ(bubble_formula({4, 4, 2, K::zb_v}), make_ratio(6, 24));
  EXPECT_EQ(bubble_formula({4, 6, 2, K::zb_v}), make_ratio(3, 36));
  // Other costs: zb-h1's formula holds; the V kinds' is exact at F = B = W only.
  EXPECT_EQ(simulate(make_schedule(4, 8, 1, K::zb_h1), {2, 3, 1}).bubble,
            bubble_formula({4, 8, 1, K::zb_h1}, {2, 3, 1}));
  EXPECT_EQ(bubble_formula({4, 8, 1, K::zb_h1}, {2, 3, 1}), make_ratio(3 * 4, 8 * 6));
  EXPECT_THROW(simulate(make_schedule(4, 8, 1, K::zb_h1), {1, 0, 1}), Error);
}

// The summary prints the formula of the run's own schedule (v only where interleaving divides
// the bubble by it; F, B, W only where the costs do not cancel).
TEST(PipelineSchedule, BubbleFormulaText) {
  EXPECT_STREQ(bubble_formula_text(K::gpipe), "(p-1)/m");
  EXPECT_STREQ(bubble_formula_text(K::one_f_one_b), "(p-1)/m");
  EXPECT_STREQ(bubble_formula_text(K::interleaved), "(p-1)/(v m)");
  EXPECT_STREQ(bubble_formula_text(K::zb_h1), "(p-1) max(F, B, F+B-W)/(m (F+B+W))");
  EXPECT_STREQ(bubble_formula_text(K::zb_v), "max(p-1, 4p-2-2m) F/(2m (F+B+W))");
  EXPECT_STREQ(bubble_formula_text(K::dualpipe_v), "(p-1) F/(2m (F+B+W))");
}

// The lists assume sends that do not block (doc/pipeline.md, "For the executor"): with
// rendezvous sends only gpipe, any kind on one stage and zb-v with one micro-batch (one
// pass after another) run to the end.
TEST(PipelineSchedule, OneFOneBNeedsNonBlockingSends) {
  for (PipeSchedule kind : kAllKinds) {
    for (const ScheduleShape& shape : all_shapes(kind)) {
      const bool completes = kind == PipeSchedule::gpipe || shape.stages == 1 ||
                             (kind == K::zb_v && shape.micro_batches == 1);
      EXPECT_EQ(completes_with_blocking_sends(make_schedule(shape)), completes) << name(shape);
    }
  }
}

// ---- errors --------------------------------------------------------------------------

void expect_error(const ScheduleShape& shape, const std::string& fragment) {
  SCOPED_TRACE(name(shape));
  try {
    make_schedule(shape);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(e.collective());
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(PipelineSchedule, ShapeErrors) {
  using K = PipeSchedule;
  expect_error({4, 3, 1, K::one_f_one_b},
               "the 1f1b schedule needs at least as many micro-batches as stages, but "
               "micro-batches is 3 and stages is 4; raise micro-batches to 4 or more");
  expect_error({2, 4, 2, K::one_f_one_b},
               "the 1f1b schedule runs one model chunk per stage but chunks per stage is 2");
  expect_error({2, 4, 3, K::gpipe}, "the gpipe schedule runs one model chunk per stage");
  expect_error({4, 8, 1, K::interleaved},
               "needs at least 2 chunks per stage, but chunks per "
               "stage is 1; use 1f1b");
  expect_error({1, 4, 2, K::interleaved}, "needs at least 2 stages, but stages is 1");
  expect_error({4, 6, 2, K::interleaved},
               "micro-batches to be a multiple of stages (Megatron-LM's rule), but "
               "micro-batches is 6 and stages is 4; use 4 or 8 micro-batches");
  expect_error({4, 3, 2, K::interleaved},
               "micro-batches is 3 and stages is 4; use 4 "
               "micro-batches");
  expect_error({0, 4, 1, K::gpipe}, "stages (parallel.pp) is 0; it must be at least 1");
  expect_error({2, 0, 1, K::gpipe}, "micro-batches is 0; it must be at least 1");
  expect_error({2, 2, 0, K::gpipe}, "chunks per stage is 0; it must be at least 1");
  // gpipe takes any m; 1f1b takes m = p.
  EXPECT_NO_THROW(make_schedule(8, 1, 1, K::gpipe));
  EXPECT_NO_THROW(make_schedule(8, 8, 1, K::one_f_one_b));
  // The split kinds.
  expect_error({4, 8, 2, K::zb_h1},
               "pipeline: the zb-h1 schedule runs one model chunk per stage, but "
               "parallel.pp_virtual is 2; set parallel.pp_virtual = 1");
  expect_error({4, 3, 1, K::zb_h1},
               "pipeline: the zb-h1 schedule needs at least as many micro-batches as stages "
               "(parallel.pp = 4), but micro-batches is 3; raise micro-batches to 4 or more");
  expect_error({4, 8, 1, K::zb_v},
               "pipeline: the zb-v schedule runs exactly 2 model chunks per stage, placed in a "
               "V, but parallel.pp_virtual is 1; set parallel.pp_virtual = 2");
  expect_error({4, 8, 3, K::dualpipe_v},
               "pipeline: the dualpipev schedule runs exactly 2 model chunks per stage, placed "
               "in a V, but parallel.pp_virtual is 3; set parallel.pp_virtual = 2");
  expect_error({4, 7, 2, K::dualpipe_v},
               "pipeline: the dualpipev schedule needs at least twice as many micro-batches as "
               "stages (parallel.pp = 4), but micro-batches is 7; raise micro-batches to 8 or "
               "more");
  EXPECT_NO_THROW(make_schedule(8, 8, 1, K::zb_h1));
  EXPECT_NO_THROW(make_schedule(8, 1, 2, K::zb_v));  // zb-v takes any m
  EXPECT_NO_THROW(make_schedule(8, 16, 2, K::dualpipe_v));
}

// The executor checks the step's tags against the pipeline communicator's MPI_TAG_UB.
TEST(PipelineSchedule, TagLimit) {
  using K = PipeSchedule;
  // p = 2, m = 8: tags 0 .. 2 m (C - 1) - 1 = 15.
  EXPECT_NO_THROW(require_tags({2, 8, 1, K::one_f_one_b}, 15));
  // p = 4, v = 2 (C = 8), m = 8: tags up to 111.
  EXPECT_NO_THROW(require_tags({4, 8, 2, K::interleaved}, 111));
  try {
    require_tags({4, 8, 2, K::interleaved}, 100);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(e.collective());
    EXPECT_NE(std::string(e.what()).find(
                  "pipeline: 8 micro-batches x 8 model chunks use message tags up to 2 m (C - 1) "
                  "- 1 = 111, above the largest tag the pipeline communicator accepts "
                  "(MPI_TAG_UB = 100); use at most 7 micro-batches"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(require_tags({8, 2048, 1, K::one_f_one_b}, 32767));  // 2 m 7 = 28672 tags
}

TEST(PipelineSchedule, KindNames) {
  for (PipeSchedule k : kFusedKinds) EXPECT_EQ(parse_pipe_schedule(to_string(k)), k);
  EXPECT_STREQ(to_string(K::zb_h1), "zb-h1");
  EXPECT_STREQ(to_string(K::zb_v), "zb-v");
  EXPECT_STREQ(to_string(K::dualpipe_v), "dualpipev");
  for (PipeSchedule k : kSplitKinds) {
    EXPECT_TRUE(splits_backward(k));
    EXPECT_EQ(parse_pipe_schedule(to_string(k)), k);
  }
  for (PipeSchedule k : kFusedKinds) EXPECT_FALSE(splits_backward(k));
  try {
    parse_pipe_schedule("1F1B-interleaved");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(e.collective());
    EXPECT_STREQ(e.what(),
                 "pipeline schedule '1F1B-interleaved' is not known; choose gpipe, "
                 "1f1b, interleaved, zb-h1, zb-v or dualpipev");
  }
}

// ---- the checker rejects broken schedules ------------------------------------------------

// The first problem contains fragment.
void expect_rejected(const Schedule& sched, const std::string& fragment) {
  const std::vector<std::string> problems = check_schedule(sched);
  ASSERT_FALSE(problems.empty()) << "accepted; expected: " << fragment;
  EXPECT_NE(problems.front().find(fragment), std::string::npos) << join(problems);
  EXPECT_THROW(simulate(sched), Error);
}

std::size_t find(const std::vector<Op>& ops, Op op) {
  const auto it = std::find(ops.begin(), ops.end(), op);
  EXPECT_NE(it, ops.end());
  return std::size_t(it - ops.begin());
}

TEST(PipelineSchedule, CheckerRejectsBackwardBeforeForward) {
  // gpipe with one stage: swap F0 and B0.
  Schedule s = make_schedule(1, 2, 1, PipeSchedule::gpipe);
  std::swap(s.stages[0][0], s.stages[0][2]);
  expect_rejected(s,
                  "stage 0: backward(micro 0, chunk 0) at op 0 comes before its forward at "
                  "op 2");
}

TEST(PipelineSchedule, CheckerRejectsMissingBackward) {
  Schedule s = make_schedule(4, 8, 1, PipeSchedule::one_f_one_b);
  auto& ops = s.stages[3];
  ops.erase(ops.begin() + find(ops, {Op::backward, 5, 0, -1}));
  expect_rejected(s, "stage 3: backward(micro 5, chunk 0) appears 0 times, not 1");
}

TEST(PipelineSchedule, CheckerRejectsRecvWithoutSend) {
  Schedule s = make_schedule(4, 8, 1, PipeSchedule::one_f_one_b);
  auto& ops = s.stages[1];
  ops.erase(ops.begin() + find(ops, {Op::send_act, 2, 0, 2}));
  expect_rejected(s, "stage 1: send_act(micro 2, chunk 0) appears 0 times, not 1");
}

TEST(PipelineSchedule, CheckerRejectsDuplicateAndStrayOps) {
  Schedule s = make_schedule(2, 2, 1, PipeSchedule::gpipe);
  s.stages[0].push_back({Op::forward, 1, 0, -1});
  expect_rejected(s, "stage 0: forward(micro 1, chunk 0) appears 2 times, not 1");
  s = make_schedule(2, 2, 1, PipeSchedule::gpipe);
  s.stages[1].push_back({Op::send_act, 1, 0, 0});  // the last model chunk sends nothing on
  expect_rejected(s,
                  "stage 1 op 8 send_act(micro 1, chunk 0, peer 0): model chunk 1 of 2 has "
                  "no such message");
  s = make_schedule(2, 2, 1, PipeSchedule::gpipe);
  s.stages[0][1].peer = 0;  // F0's send_act to itself
  expect_rejected(s, "stage 0 op 1 send_act(micro 0, chunk 0, peer 0): the peer should be 1");
  s = make_schedule(2, 2, 1, PipeSchedule::gpipe);
  s.stages[0][0].micro = 2;
  expect_rejected(s, "out of range");
}

TEST(PipelineSchedule, CheckerRejectsSendAwayFromItsCompute) {
  Schedule s = make_schedule(2, 2, 1, PipeSchedule::gpipe);
  // Stage 0: F0 send0 F1 send1 ...: move send0 after F1.
  std::swap(s.stages[0][1], s.stages[0][2]);
  expect_rejected(s,
                  "stage 0: send_act(micro 0, chunk 0) at op 2 is not immediately after its "
                  "forward at op 0");
}

TEST(PipelineSchedule, CheckerRejectsMismatchedPairing) {
  // Stage 0 runs micro-batch 1 before 0, stage 1 receives 0 first.
  Schedule s = make_schedule(2, 2, 1, PipeSchedule::gpipe);
  auto& ops = s.stages[0];  // F0 S0 F1 S1 R0 B0 R1 B1
  std::swap_ranges(ops.begin(), ops.begin() + 2, ops.begin() + 2);
  expect_rejected(s,
                  "activations from stage 0 to stage 1: send 0 carries micro 1 across "
                  "boundary 0 but recv 0 expects micro 0 across boundary 0");
}

// A split schedule with a W before its B, with a fused backward, without a W; a fused one
// with a B; a message across the turn of a V.
TEST(PipelineSchedule, CheckerRejectsBrokenSplitBackwards) {
  Schedule s = make_schedule(2, 3, 1, K::zb_h1);
  std::swap(s.stages[0][5], s.stages[0][6]);  // stage 0: ... R0 B0 W0 ... -> R0 W0 B0
  expect_rejected(s,
                  "stage 0: backward_weight(micro 0, chunk 0) at op 5 comes before its "
                  "backward_input at op 6");
  s = make_schedule(2, 3, 1, K::zb_h1);
  s.stages[0][5].kind = Op::backward;
  expect_rejected(s,
                  "stage 0 op 5 backward(micro 0, chunk 0): the zb-h1 schedule runs "
                  "backward_input and backward_weight, not backward");
  s = make_schedule(2, 3, 1, K::zb_h1);
  s.stages[1].pop_back();
  expect_rejected(s, "stage 1: backward_weight(micro 2, chunk 0) appears 0 times, not 1");
  s = make_schedule(2, 3, 1, K::one_f_one_b);
  s.stages[0][5].kind = Op::backward_input;
  expect_rejected(s,
                  "stage 0 op 5 backward_input(micro 0, chunk 0): the 1f1b schedule runs fused "
                  "backwards, not backward_input");
  // zb-v, p = 2: stage 1 runs model chunks 1 and 2, which exchange nothing.
  s = make_schedule(2, 4, 2, K::zb_v);
  s.stages[1].insert(s.stages[1].begin() + 2, Op{Op::send_act, 0, 0, 1});
  expect_rejected(s,
                  "stage 1 op 2 send_act(micro 0, chunk 0, peer 1): model chunk 1 of 4 has no "
                  "such message");
}

TEST(PipelineSchedule, CheckerRejectsDeadlock) {
  // Stage 0 waits for micro 0's gradient before sending micro 1's activations; stage 1
  // waits for micro 1's activations before sending micro 0's gradient.
  const auto F = Op::forward, B = Op::backward;
  Schedule s{{2, 2, 1, PipeSchedule::gpipe}, {}};
  s.stages.push_back({{F, 0, 0, -1},
                      {Op::send_act, 0, 0, 1},
                      {Op::recv_grad, 0, 0, 1},
                      {B, 0, 0, -1},
                      {F, 1, 0, -1},
                      {Op::send_act, 1, 0, 1},
                      {Op::recv_grad, 1, 0, 1},
                      {B, 1, 0, -1}});
  s.stages.push_back({{Op::recv_act, 0, 0, 0},
                      {F, 0, 0, -1},
                      {Op::recv_act, 1, 0, 0},
                      {F, 1, 0, -1},
                      {B, 0, 0, -1},
                      {Op::send_grad, 0, 0, 0},
                      {B, 1, 0, -1},
                      {Op::send_grad, 1, 0, 0}});
  const std::vector<std::string> problems = check_schedule(s);
  ASSERT_EQ(problems.size(), 2u) << join(problems);
  EXPECT_EQ(problems[0],
            "stage 0 op 2 recv_grad(micro 0, chunk 0, peer 1): waits for ever "
            "(deadlock): stage 1 never reaches the matching send");
  EXPECT_EQ(problems[1],
            "stage 1 op 2 recv_act(micro 1, chunk 0, peer 0): waits for ever "
            "(deadlock): stage 0 never reaches the matching send");
  // The same lists with stage 0 sending micro 1 first run to the end.
  std::swap_ranges(s.stages[0].begin() + 2, s.stages[0].begin() + 4, s.stages[0].begin() + 4);
  EXPECT_TRUE(check_schedule(s).empty()) << join(check_schedule(s));
}

// ---- the timelines in doc/pipeline.md ----------------------------------------------------

// doc/pipeline.md shows these timelines; this test prints them
// (--gtest_filter=PipelineSchedule.TimelinesInDoc) and fails if the doc differs.
TEST(PipelineSchedule, TimelinesInDoc) {
  // The repository (not __FILE__: ccache's base_dir makes it a relative path).
  const auto root = std::filesystem::path(TESSERA_SOURCE_DIR);
  std::ifstream in(root / "doc" / "pipeline.md");
  ASSERT_TRUE(in) << root / "doc" / "pipeline.md";
  std::stringstream doc;
  doc << in.rdbuf();
  for (const Schedule& s : {make_schedule(4, 8, 1, PipeSchedule::gpipe),
                            make_schedule(4, 8, 1, PipeSchedule::one_f_one_b),
                            make_schedule(4, 8, 2, PipeSchedule::interleaved),
                            make_schedule(4, 8, 1, PipeSchedule::zb_h1),
                            make_schedule(4, 8, 2, PipeSchedule::zb_v),
                            make_schedule(4, 8, 2, PipeSchedule::dualpipe_v)}) {
    const std::string timeline = render_timeline(s);
    std::cout << timeline << "\n";
    EXPECT_NE(doc.str().find(timeline), std::string::npos)
        << "doc/pipeline.md lacks this timeline:\n"
        << timeline;
  }
}

}  // namespace
}  // namespace tessera::pp

// Stage partitioning: layers cut into v p model chunks, balanced by cost, even, or listed.
#include <functional>
#include <random>
#include "parallel/pp/stage_layers.hpp"

namespace tessera::pp {
namespace {

// A cost-balanced cut with uniform blocks and a free embedding and head is the even one.
TEST(PipelineStages, BalancedWithoutHeadCostIsEven) {
  EXPECT_EQ(balanced_chunk_sizes(8, 4, {0, 1, 0}), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(balanced_chunk_sizes(3, 1, {0, 1, 0}), (std::vector<int64_t>{3}));
  // 6 blocks in 4 chunks: two chunks must take 2; the most expensive chunk costs 2 either way
  // and the sum of squares is the same, so the first cut found (earliest chunks first) wins.
  const std::vector<int64_t> six = balanced_chunk_sizes(6, 4, {0, 1, 0});
  EXPECT_EQ(six.size(), 4u);
  EXPECT_EQ(*std::max_element(six.begin(), six.end()), 2);
}

// The head counts: at 2.5 blocks the last chunk gets 1 block (cost 3.5) and the others
// share the rest, so no chunk costs more than the last one must.
TEST(PipelineStages, BalancedGivesTheHeadChunkFewerBlocks) {
  const std::vector<int64_t> s = balanced_chunk_sizes(10, 4, {0, 1, 2.5});
  EXPECT_EQ(s.back(), 1);
  EXPECT_EQ(s[0] + s[1] + s[2], 9);
  for (size_t c = 0; c + 1 < s.size(); ++c) EXPECT_EQ(s[c], 3);
  // The embedding counts as well: a costly embedding takes blocks from chunk 0.
  const std::vector<int64_t> e = balanced_chunk_sizes(8, 2, {2, 1, 0});
  EXPECT_EQ(e, (std::vector<int64_t>{3, 5}));
}

// Against brute force: every cut of L <= 9 blocks into C <= 4 chunks, random costs; the
// balanced cut's most expensive chunk is the least possible.
TEST(PipelineStages, BalancedIsOptimalAgainstEveryCut) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> u(0, 3);
  for (int C = 1; C <= 4; ++C)
    for (int64_t L = C; L <= 9; ++L)
      for (int trial = 0; trial < 5; ++trial) {
        const ChunkCosts k{u(gen), 1, u(gen)};
        auto worst = [&](const std::vector<int64_t>& s) {
          double w = 0;
          for (int c = 0; c < C; ++c)
            w = std::max(w, double(s[size_t(c)]) * k.block + (c == 0 ? k.embedding : 0) +
                                (c == C - 1 ? k.head : 0));
          return w;
        };
        double best = 1e30;
        std::vector<int64_t> s(size_t(C), 1);
        std::function<void(int, int64_t)> each = [&](int c, int64_t left) {
          if (c == C - 1) {
            s[size_t(c)] = left;
            best = std::min(best, worst(s));
            return;
          }
          for (int64_t n = 1; n <= left - (C - 1 - c); ++n) s[size_t(c)] = n, each(c + 1, left - n);
        };
        each(0, L);
        const std::vector<int64_t> got = balanced_chunk_sizes(L, C, k);
        int64_t sum = 0;
        for (int64_t n : got) {
          EXPECT_GE(n, 1);
          sum += n;
        }
        EXPECT_EQ(sum, L);
        EXPECT_NEAR(worst(got), best, 1e-9) << "L " << L << " C " << C;
      }
}

// A GPT-2-small-like head (vocabulary 50304 x 768 against 12 x 768^2 blocks) weighs about
// four blocks, so with 12 layers on 4 stages the last stage runs fewer of them.
TEST(PipelineStages, Gpt2SmallHeadTakesLayersFromTheLastStage) {
  ModelConfig c;
  c.arch = Arch::gpt2, c.layers = 12, c.d_model = 768, c.heads = 12, c.kv_heads = 12;
  c.head_dim = 64, c.ffn_hidden = 3072, c.vocab = 50257, c.vocab_padded = 50304, c.seq_len = 1024;
  const ChunkCosts k = chunk_costs(c);
  EXPECT_GT(k.head / k.block, 3.0);
  const std::vector<int64_t> s = split_layers(c, 4, "balanced");
  EXPECT_EQ(s.back(), 1);
  EXPECT_EQ(split_layers(c, 4, "even"), (std::vector<int64_t>{3, 3, 3, 3}));
  EXPECT_EQ(split_layers(c, 4, "4,4,3,1"), (std::vector<int64_t>{4, 4, 3, 1}));
}

TEST(PipelineStages, SplitErrorsSayWhatIsWrong) {
  ModelConfig c;
  c.layers = 6, c.d_model = 8, c.heads = 2, c.kv_heads = 2, c.head_dim = 4, c.ffn_hidden = 16;
  c.vocab = c.vocab_padded = 32, c.seq_len = 4;
  auto error = [&](int C, const char* spec) -> std::string {
    try {
      split_layers(c, C, spec);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(error(8, "balanced").find("a stage would be left without layers"), std::string::npos);
  EXPECT_NE(error(4, "even").find("is not divisible into pp x pp_virtual = 4"), std::string::npos);
  EXPECT_NE(error(3, "2,2").find("lists 2 model chunks but parallel.pp x parallel.pp_virtual = 3"),
            std::string::npos);
  EXPECT_NE(error(3, "2,2,3").find("holds 7 layers but model.layers = 6"), std::string::npos);
  EXPECT_NE(error(3, "3,3,0").find("a stage would be left without layers"), std::string::npos);
  EXPECT_NE(error(2, "3,x").find("'x' is not a number"), std::string::npos);
  EXPECT_EQ(error(3, "even"), "no error");
}

TEST(PipelineStages, InterleavedStagesHoldEveryPthChunk) {
  // 8 layers, p = 2, v = 2: chunks of 2 layers; stage 0 holds chunks 0 and 2, stage 1 1 and 3.
  const std::vector<int64_t> sizes{2, 2, 2, 2};
  const ScheduleShape shape{2, 4, 2, PipeSchedule::interleaved};
  const std::vector<ChunkLayers> s0 = stage_layers(sizes, shape, 0);
  const std::vector<ChunkLayers> s1 = stage_layers(sizes, shape, 1);
  ASSERT_EQ(s0.size(), 2u);
  ASSERT_EQ(s1.size(), 2u);
  EXPECT_EQ(s0[0].first, 0); EXPECT_EQ(s0[0].last, 2); EXPECT_TRUE(s0[0].embedding);
  EXPECT_EQ(s0[1].first, 4); EXPECT_EQ(s0[1].last, 6); EXPECT_FALSE(s0[1].head);
  EXPECT_EQ(s1[0].first, 2); EXPECT_EQ(s1[0].last, 4); EXPECT_FALSE(s1[0].embedding);
  EXPECT_EQ(s1[1].first, 6); EXPECT_EQ(s1[1].last, 8); EXPECT_TRUE(s1[1].head);
}

// A V's stage holds the chunk going down and the one coming back up: stage 0 the first
// (with the embedding) and the last (with the head).
TEST(PipelineStages, VStagesHoldBothEnds) {
  const std::vector<int64_t> sizes{1, 2, 3, 2};  // model chunks 0..3, p = 2
  const ScheduleShape shape{2, 4, 2, PipeSchedule::zb_v};
  const std::vector<ChunkLayers> s0 = stage_layers(sizes, shape, 0);
  const std::vector<ChunkLayers> s1 = stage_layers(sizes, shape, 1);
  ASSERT_EQ(s0.size(), 2u);
  ASSERT_EQ(s1.size(), 2u);
  EXPECT_EQ(s0[0].first, 0); EXPECT_EQ(s0[0].last, 1);
  EXPECT_TRUE(s0[0].embedding); EXPECT_FALSE(s0[0].head);
  EXPECT_EQ(s0[1].first, 6); EXPECT_EQ(s0[1].last, 8);
  EXPECT_FALSE(s0[1].embedding); EXPECT_TRUE(s0[1].head);
  EXPECT_EQ(s1[0].first, 1); EXPECT_EQ(s1[0].last, 3);
  EXPECT_EQ(s1[1].first, 3); EXPECT_EQ(s1[1].last, 6);
  for (const ChunkLayers& k : s1) EXPECT_FALSE(k.embedding || k.head);
  EXPECT_THROW(stage_layers(sizes, {2, 4, 1, PipeSchedule::zb_h1}, 0), Error);  // 2 chunks, not 4
}

}  // namespace
}  // namespace tessera::pp
