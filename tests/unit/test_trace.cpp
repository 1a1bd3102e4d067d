// The trace recorder (core/trace.hpp) on a fake clock: the window of traced steps, the
// capacity (events beyond it are dropped, and the reserved vector never grows), spans and
// their fields, phases of a PhaseTimer as spans, and nothing at all without a trace.
#include <gtest/gtest.h>

#include <string>

#include "core/timer.hpp"
#include "core/trace.hpp"

namespace tessera {
namespace {

double g_now = 0;
double fake_clock() {
  return g_now += 1.0;
}  // every reading one second later

TEST(Trace, RecordsOnlyTheFirstStepsOfTheRun) {
  Trace t(2, 100, fake_clock);
  { TraceSpan s(&t, TraceKind::step, "step"); }  // before any step: not recording
  EXPECT_TRUE(t.events().empty());
  for (int64_t step = 5; step <= 8; ++step) {  // a resumed run starts at step 5
    t.begin_step(step);
    EXPECT_EQ(t.recording(), step <= 6) << step;
    TraceSpan s(&t, TraceKind::step, "step");
  }
  ASSERT_EQ(t.events().size(), 2u);
  EXPECT_EQ(t.events()[0].step, 5);
  EXPECT_EQ(t.events()[1].step, 6);
  EXPECT_EQ(t.first_step(), 5);
  EXPECT_EQ(t.last_step(), 6);
}

TEST(Trace, SpanFieldsAndClock) {
  g_now = 0;
  Trace t(1, 100, fake_clock);
  t.set_clock(10.0, 4.0);  // rank 0's clock = local + 10; shown from rank 0's time 4
  t.begin_step(1);
  {
    TraceSpan s(&t, TraceKind::p2p, "send");
    s.micro(3, 1).message("activation", 2, 64);
  }
  const int16_t g = t.intern("dp");
  EXPECT_EQ(t.intern("tp"), g + 1);
  EXPECT_EQ(t.intern("dp"), g);
  t.add_ending_now(TraceKind::collective, "all_reduce", 0.5, g, 16);
  ASSERT_EQ(t.events().size(), 2u);
  const TraceEvent& e = t.events()[0];
  EXPECT_EQ(std::string(e.name), "send");
  EXPECT_EQ(e.begin, 1.0);
  EXPECT_EQ(e.end, 2.0);
  EXPECT_EQ(t.to_us(e.begin), (1.0 + 10.0 - 4.0) * 1e6);
  EXPECT_EQ(e.micro, 3);
  EXPECT_EQ(e.chunk, 1);
  EXPECT_EQ(e.peer, 2);
  EXPECT_EQ(e.bytes, 64);
  EXPECT_EQ(std::string(e.message), "activation");
  EXPECT_EQ(trace_lane(e.kind), 1);
  const TraceEvent& c = t.events()[1];
  EXPECT_EQ(c.end - c.begin, 0.5);
  EXPECT_EQ(t.names()[size_t(c.group)], "dp");
  EXPECT_EQ(c.micro, -1);
  EXPECT_EQ(trace_lane(c.kind), 2);
}

TEST(Trace, CapacityDropsAndNeverReallocates) {
  Trace t(1, 3, fake_clock);
  t.begin_step(1);
  const TraceEvent* data = t.events().data();
  for (int i = 0; i < 5; ++i) TraceSpan s(&t, TraceKind::compute, "forward");
  EXPECT_EQ(t.events().size(), 3u);
  EXPECT_EQ(t.dropped(), 2);
  EXPECT_EQ(t.events().data(), data);
  EXPECT_GE(t.events().capacity(), 3u);
}

TEST(Trace, NullTraceRecordsNothing) {
  TraceSpan s(nullptr, TraceKind::compute, "forward");
  s.micro(1, 0).message("gradient", 0, 8);  // no-ops
  PhaseTimer timer;
  timer.enter(Phase::data);
  timer.stop();
  EXPECT_GE(timer.seconds(Phase::data), 0.0);
}

TEST(Trace, PhasesAreSpans) {
  Trace t(1, 100, fake_clock);
  PhaseTimer timer;
  timer.set_trace(&t);
  timer.enter(Phase::data);  // not recording yet
  t.begin_step(1);
  timer.enter(Phase::forward);
  timer.enter(Phase::optimizer);
  timer.stop();
  ASSERT_EQ(t.events().size(), 2u);
  EXPECT_EQ(std::string(t.events()[0].name), "forward");
  EXPECT_EQ(std::string(t.events()[1].name), "optimizer");
  EXPECT_EQ(t.events()[0].kind, TraceKind::phase);
  EXPECT_LE(t.events()[0].end, t.events()[1].begin);
}

}  // namespace
}  // namespace tessera
