// Pipeline schedules as data (parallel/pp/schedule.hpp, doc/pipeline.md): every allowed
// shape up to p = 8, m = 16, v = 4 is complete, ordered, paired, deadlock-free, has the
// bubble (p-1)/m or (p-1)/(v m) exactly and the documented peak activations; bad shapes
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

constexpr PipeSchedule kAllKinds[] = {PipeSchedule::gpipe, PipeSchedule::one_f_one_b,
                                      PipeSchedule::interleaved};

bool allowed(const ScheduleShape& shape) {
  try {
    require_valid(shape);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// Every allowed shape of one kind with p <= 8, m <= 16, v <= 4.
std::vector<ScheduleShape> all_shapes(PipeSchedule kind) {
  std::vector<ScheduleShape> shapes;
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
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

// The properties issue 6 asks for, checked here without trusting check_schedule alone.
void expect_correct(const ScheduleShape& shape) {
  SCOPED_TRACE(name(shape));
  const Schedule sched = make_schedule(shape);
  ASSERT_EQ(int(sched.stages.size()), shape.stages);
  const std::vector<std::string> problems = check_schedule(sched);
  ASSERT_TRUE(problems.empty()) << join(problems);

  // Each (micro-batch, local chunk) forward and backward exactly once per stage; sends and
  // recvs per direction: one per micro-batch per boundary in all.
  const int p = shape.stages, m = shape.micro_batches, v = shape.chunks, C = shape.model_chunks();
  std::map<Op::Kind, int> total;
  for (int s = 0; s < p; ++s) {
    std::set<std::pair<int, int>> fwd, bwd;
    for (const Op& op : sched.stages[s]) {
      ++total[op.kind];
      if (op.kind == Op::forward) {
        EXPECT_TRUE(fwd.insert({op.micro, op.chunk}).second);
      } else if (op.kind == Op::backward) {
        EXPECT_TRUE(bwd.insert({op.micro, op.chunk}).second);
      }
    }
    EXPECT_EQ(int(fwd.size()), m * v);
    EXPECT_EQ(int(bwd.size()), m * v);
  }
  for (Op::Kind k : {Op::send_act, Op::recv_act, Op::send_grad, Op::recv_grad}) {
    EXPECT_EQ(total[k], m * (C - 1)) << to_string(k);
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

  // The ideal-time simulation: dependency order in time, and the exact bubble, for several
  // forward/backward costs.
  for (const OpCosts costs : {OpCosts{1, 2}, OpCosts{1, 1}, OpCosts{2, 3}, OpCosts{1, 3}}) {
    const Simulation sim = simulate(sched, costs);
    // [micro][model chunk] -> interval, forward and backward.
    std::vector<std::vector<Interval>> f(m, std::vector<Interval>(C)), b(f);
    for (int s = 0; s < p; ++s) {
      for (const Interval& iv : sim.timeline[s]) {
        const int c = shape.model_chunk(s, iv.op.chunk);
        (iv.op.kind == Op::forward ? f : b)[iv.op.micro][c] = iv;
      }
    }
    for (int i = 0; i < m; ++i) {
      for (int c = 0; c < C; ++c) {
        EXPECT_LE(f[i][c].end, b[i][c].begin) << i << " " << c;
        if (c + 1 < C) {
          EXPECT_LE(f[i][c].end, f[i][c + 1].begin) << i << " " << c;
          EXPECT_LE(b[i][c + 1].end, b[i][c].begin) << i << " " << c;
        }
      }
    }
    EXPECT_EQ(sim.compute, std::int64_t(m) * v * (costs.forward + costs.backward));
    // bubble = (makespan - compute) / compute, exactly:
    const int vv = shape.kind == PipeSchedule::interleaved ? v : 1;
    EXPECT_EQ(sim.bubble, make_ratio(p - 1, vv * m)) << costs.forward << "/" << costs.backward;
    EXPECT_EQ(sim.bubble, bubble_formula(shape));
    EXPECT_EQ((sim.makespan - sim.compute) * vv * m, sim.compute * (p - 1));
  }

  // Peak activations held per stage, in chunk activations.
  const std::vector<int> peak = peak_activations(sched);
  for (int s = 0; s < p; ++s) {
    EXPECT_EQ(peak[s], peak_activations_formula(shape, s)) << "stage " << s;
    switch (shape.kind) {
      case PipeSchedule::gpipe:
        EXPECT_EQ(peak[s], m);
        break;
      case PipeSchedule::one_f_one_b:
        EXPECT_EQ(peak[s], std::min(p - s, m));
        EXPECT_LE(peak[s], p);
        break;
      case PipeSchedule::interleaved:
        EXPECT_EQ(peak[s], std::min(2 * (p - s - 1) + (v - 1) * p + 1, v * m));
        break;
    }
  }
}

TEST(PipelineSchedule, EveryGPipeShape) {
  const auto shapes = all_shapes(PipeSchedule::gpipe);
  EXPECT_EQ(shapes.size(), 8u * 16u);
  for (const ScheduleShape& shape : shapes) expect_correct(shape);
}

TEST(PipelineSchedule, Every1F1BShape) {
  const auto shapes = all_shapes(PipeSchedule::one_f_one_b);
  EXPECT_EQ(shapes.size(), 100u);  // sum over p = 1..8 of (17 - p)
  for (const ScheduleShape& shape : shapes) expect_correct(shape);
}

TEST(PipelineSchedule, EveryInterleavedShape) {
  const auto shapes = all_shapes(PipeSchedule::interleaved);
  // p = 2..8 with m a multiple of p: 8 + 5 + 4 + 3 + 2 + 2 + 2 = 26, times v = 2, 3, 4.
  EXPECT_EQ(shapes.size(), 78u);
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
    out += cat(op.kind == Op::forward ? "F" : "B", op.micro, char('a' + op.chunk), " ");
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

// The lists assume sends that do not block (doc/pipeline.md, "For the executor"): with
// rendezvous sends only gpipe, and 1f1b on one stage, run to the end.
TEST(PipelineSchedule, OneFOneBNeedsNonBlockingSends) {
  for (PipeSchedule kind : kAllKinds) {
    for (const ScheduleShape& shape : all_shapes(kind)) {
      const bool completes = kind == PipeSchedule::gpipe || shape.stages == 1;
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
  for (PipeSchedule k : kAllKinds) EXPECT_EQ(parse_pipe_schedule(to_string(k)), k);
  try {
    parse_pipe_schedule("1F1B-interleaved");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(e.collective());
    EXPECT_STREQ(e.what(),
                 "pipeline schedule '1F1B-interleaved' is not known; choose gpipe, "
                 "1f1b or interleaved");
  }
}

// The summary prints the formula of the run's own schedule (v only where interleaving divides
// the bubble by it).
TEST(PipelineSchedule, BubbleFormulaText) {
  EXPECT_STREQ(bubble_formula_text(PipeSchedule::gpipe), "(p-1)/m");
  EXPECT_STREQ(bubble_formula_text(PipeSchedule::one_f_one_b), "(p-1)/m");
  EXPECT_STREQ(bubble_formula_text(PipeSchedule::interleaved), "(p-1)/(v m)");
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
                            make_schedule(4, 8, 2, PipeSchedule::interleaved)}) {
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
  const std::vector<ChunkLayers> s0 = stage_layers(sizes, 2, 0), s1 = stage_layers(sizes, 2, 1);
  ASSERT_EQ(s0.size(), 2u);
  ASSERT_EQ(s1.size(), 2u);
  EXPECT_EQ(s0[0].first, 0); EXPECT_EQ(s0[0].last, 2); EXPECT_TRUE(s0[0].embedding);
  EXPECT_EQ(s0[1].first, 4); EXPECT_EQ(s0[1].last, 6); EXPECT_FALSE(s0[1].head);
  EXPECT_EQ(s1[0].first, 2); EXPECT_EQ(s1[0].last, 4); EXPECT_FALSE(s1[0].embedding);
  EXPECT_EQ(s1[1].first, 6); EXPECT_EQ(s1[1].last, 8); EXPECT_TRUE(s1[1].head);
}

}  // namespace
}  // namespace tessera::pp
