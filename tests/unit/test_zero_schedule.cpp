// ZeroSchedule: the decisions ZeRO-1/2/3 execute and tessera-plan replays. Checked over whole
// steps of every schedule shape the runtime produces, without MPI.
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "parallel/dp/zero_schedule.hpp"

namespace tessera {
namespace {

// One training step of `micro` micro-batches over parts 0..head (forward in order, backward
// in reverse), the last micro-batch armed as the trainer arms it.
std::vector<ZeroAction> run_step(ZeroSchedule& s, int head, int micro) {
  std::vector<ZeroAction> all;
  auto add = [&](std::vector<ZeroAction> a) { all.insert(all.end(), a.begin(), a.end()); };
  s.begin_step();
  for (int m = 0; m < micro; ++m) {
    for (int q = 0; q <= head; ++q) add(s.begin(q, Pass::forward, true)), add(s.end(q, Pass::forward, true, false));
    for (int q = head; q >= 0; --q)
      add(s.begin(q, Pass::backward, true)), add(s.end(q, Pass::backward, true, m == micro - 1));
  }
  add(s.finish());
  return all;
}

int count(const std::vector<ZeroAction>& a, ZeroAction::Kind k, int part = -1) {
  int n = 0;
  for (const ZeroAction& x : a) n += x.kind == k && (part < 0 || x.part == part);
  return n;
}

TEST(ZeroSchedule, Stage1ReducesEachPartOnceDuringTheLastBackward) {
  const int head = 3;
  ZeroSchedule s(1, PartAccess{head, false}, {16, 32, 32, 16}, 2);
  const std::vector<ZeroAction> a = run_step(s, head, 3);
  for (int q = 0; q <= head; ++q) {
    EXPECT_EQ(count(a, ZeroAction::reduce, q), 1) << q;
    EXPECT_EQ(count(a, ZeroAction::retire, q), 1) << q;
  }
  EXPECT_EQ(count(a, ZeroAction::stage), 0);
  EXPECT_EQ(count(a, ZeroAction::fetch), 0);
  // Reductions start in backward order (head first), before the step's end retires them.
  EXPECT_EQ(a.front().kind, ZeroAction::reduce);
  EXPECT_EQ(a.front().part, head);
}

TEST(ZeroSchedule, Stage1WithoutOverlapReducesAtTheEnd) {
  const int head = 2;
  ZeroSchedule s(1, PartAccess{head, true}, {16, 16, 16}, 2);
  s.begin_step();
  for (int q = head; q >= 0; --q) EXPECT_TRUE(s.end(q, Pass::backward, true, false).empty());
  const std::vector<ZeroAction> a = s.finish();
  EXPECT_EQ(count(a, ZeroAction::reduce), head + 1);
  EXPECT_EQ(count(a, ZeroAction::retire), head + 1);
}

TEST(ZeroSchedule, StagedReductionsRespectTheInFlightBound) {
  for (int stage : {2, 3})
    for (int inflight : {1, 2, 3}) {
      const int head = 5;
      ZeroSchedule s(stage, PartAccess{head, true}, {32, 16, 16, 16, 16, 32}, inflight);
      const std::vector<ZeroAction> a = run_step(s, head, 2);
      int pending = 0, most = 0;
      std::map<int, int> staged;
      for (const ZeroAction& x : a) {
        if (x.kind == ZeroAction::stage) ++staged[x.part];
        if (x.kind == ZeroAction::reduce) {
          EXPECT_EQ(staged[x.part], 1) << "a reduction takes a staged buffer";
          --staged[x.part], ++pending;
        }
        if (x.kind == ZeroAction::retire) --pending;
        most = std::max(most, pending);
      }
      EXPECT_EQ(most, inflight) << "stage " << stage;
      EXPECT_EQ(pending, 0);
      // Every part's gradients are reduced once per micro-batch (the tied table's twice: the
      // head's forward adds to it too, but staging merges both into one buffer).
      for (int q = 0; q <= head; ++q) EXPECT_EQ(count(a, ZeroAction::reduce, q), 2) << q;
    }
}

TEST(ZeroSchedule, Stage3GathersBeforeEveryReadAndReleasesEverything) {
  const int head = 4;
  const PartAccess access{head, true};
  ZeroSchedule s(3, access, {32, 16, 16, 16, 32}, 2);
  EXPECT_EQ(count(s.initialize(), ZeroAction::build), head + 1);
  s.begin_step();
  std::vector<bool> ready(head + 1, false), fetched(head + 1, false);
  auto apply = [&](const std::vector<ZeroAction>& a) {
    for (const ZeroAction& x : a) {
      if (x.kind == ZeroAction::fetch) {
        EXPECT_FALSE(fetched[size_t(x.part)]);
        fetched[size_t(x.part)] = true;
      }
      if (x.kind == ZeroAction::wait) ready[size_t(x.part)] = fetched[size_t(x.part)];
      if (x.kind == ZeroAction::release) fetched[size_t(x.part)] = ready[size_t(x.part)] = false;
    }
  };
  for (Pass pass : {Pass::forward, Pass::backward})
    for (int i = 0; i <= head; ++i) {
      const int q = pass == Pass::forward ? i : head - i;
      apply(s.begin(q, pass, true));
      for (int r : access.reads(q, pass)) EXPECT_TRUE(ready[size_t(r)]) << q << " reads " << r;
      apply(s.end(q, pass, true, false));
    }
  apply(s.finish());
  for (int q = 0; q <= head; ++q) EXPECT_FALSE(fetched[size_t(q)]) << q;
}

TEST(ZeroSchedule, PartsOfOtherStagesAreNeverTouched) {
  // A last pipeline stage: blocks 3-4 and the head; parts 0-2 live elsewhere.
  const int head = 5;
  ZeroSchedule s(3, PartAccess{head, false}, {0, 0, 0, 16, 16, 32}, 2);
  std::vector<ZeroAction> a = s.initialize();
  s.begin_step();
  for (int q = 3; q <= head; ++q) {
    auto b = s.begin(q, Pass::forward, true), e = s.end(q, Pass::forward, true, false);
    a.insert(a.end(), b.begin(), b.end()), a.insert(a.end(), e.begin(), e.end());
  }
  for (int q = head; q >= 3; --q) {
    auto b = s.begin(q, Pass::backward, true), e = s.end(q, Pass::backward, true, true);
    a.insert(a.end(), b.begin(), b.end()), a.insert(a.end(), e.begin(), e.end());
  }
  auto f = s.finish();
  a.insert(a.end(), f.begin(), f.end());
  for (const ZeroAction& x : a) EXPECT_GE(x.part, 3) << "action on part " << x.part;
}

TEST(ZeroSchedule, DeferredPartIsReducedOnlyAtTheEnd) {
  const int head = 3;
  ZeroSchedule s(2, PartAccess{head, true}, {32, 16, 16, 32}, 2);
  s.defer(0);
  s.begin_step();
  for (int q = 0; q <= head; ++q) s.begin(q, Pass::forward, true), s.end(q, Pass::forward, true, false);
  for (int q = head; q >= 0; --q) {
    s.begin(q, Pass::backward, true);
    EXPECT_EQ(count(s.end(q, Pass::backward, true, true), ZeroAction::reduce, 0), 0);
  }
  EXPECT_EQ(count(s.finish(), ZeroAction::reduce, 0), 1);
}

// A split backward (PartAccess::split): the backward pass (B) reads the parameters and stages
// gradients but reduces nothing; the weight pass (W) reads no parameter, so ZeRO-3 gathers
// nothing for it, and a micro-batch's reduction starts at the end of its W. Stage 3, two
// micro-batches, the second's B before the first's W (as zb-h1 orders a later stage).
TEST(ZeroSchedule, SplitBackwardReducesAfterTheWeightPass) {
  const int head = 2;
  ZeroSchedule s(3, PartAccess{head, false, true}, {16, 32, 16}, 8);
  std::vector<ZeroAction> b0, w0, w1, all;
  auto add = [&](std::vector<ZeroAction>& to, std::vector<ZeroAction> a) {
    if (&to != &all) to.insert(to.end(), a.begin(), a.end());
    all.insert(all.end(), a.begin(), a.end());
  };
  s.begin_step();
  for (int m = 0; m < 2; ++m)
    for (int q = 0; q <= head; ++q)
      add(all, s.begin(q, Pass::forward, true)), add(all, s.end(q, Pass::forward, true, false));
  for (int q = head; q >= 0; --q)
    add(b0, s.begin(q, Pass::backward, true)), add(b0, s.end(q, Pass::backward, true, false));
  for (int q = head; q >= 0; --q)
    add(all, s.begin(q, Pass::backward, true)), add(all, s.end(q, Pass::backward, true, true));
  for (int q = head; q >= 0; --q)
    add(w0, s.begin(q, Pass::weight, true)), add(w0, s.end(q, Pass::weight, true, false));
  for (int q = head; q >= 0; --q)
    add(w1, s.begin(q, Pass::weight, true)), add(w1, s.end(q, Pass::weight, true, true));
  add(all, s.finish());
  EXPECT_EQ(count(b0, ZeroAction::reduce), 0);
  EXPECT_GT(count(b0, ZeroAction::stage), 0);
  for (const std::vector<ZeroAction>* w : {&w0, &w1}) {
    EXPECT_EQ(count(*w, ZeroAction::fetch), 0);
    EXPECT_EQ(count(*w, ZeroAction::wait), 0);
  }
  // W of micro-batch 0 reduces what both B's staged; W of 1 stages again and reduces that.
  for (int q = 0; q <= head; ++q) {
    EXPECT_EQ(count(w0, ZeroAction::reduce, q), 1) << q;
    EXPECT_EQ(count(w1, ZeroAction::stage, q), 1) << q;
    EXPECT_EQ(count(w1, ZeroAction::reduce, q), 1) << q;
    EXPECT_EQ(count(all, ZeroAction::retire, q), 2) << q;
  }
}

}  // namespace
}  // namespace tessera
