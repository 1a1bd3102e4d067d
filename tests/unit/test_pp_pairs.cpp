// DualPipe's paired passes (doc/pipeline.md, "Paired overlap"): which ops of a dualpipev list
// pair, that every shape completes when the executor runs each pair grouped (recvs, both
// computes, sends), and the fiber runner that interleaves the two passes (model/pass_pair.hpp).
#include <gtest/gtest.h>
#include <omp.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "model/pass_pair.hpp"
#include "parallel/pp/schedule.hpp"
#include "parallel/pp/schedule_check.hpp"

namespace tessera {
namespace {

using pp::Op;
using pp::ScheduleShape;

// Stage r of dualpipev pairs 2 (m - 2p + r + 1) times in its main part (F0 B1, F1 B0) and
// p - r - 1 times in its cool-down (F1 B0); each pair is a forward and then a backward_input
// of the other chunk and another micro-batch, with only their own messages between them.
TEST(PipelineSchedule, PairedOpsCompleteGrouped) {
  int shapes = 0;
  for (int p = 1; p <= 8; ++p)
    for (int m = 2 * p; m <= 8 * p; ++m) {
      const ScheduleShape shape{p, m, 2, PipeSchedule::dualpipe_v};
      const pp::Schedule sched = pp::make_schedule(shape);
      for (int r = 0; r < p; ++r) {
        const std::vector<Op>& ops = sched.stages[size_t(r)];
        const std::vector<pp::OpPair> pairs = pp::op_pairs(shape, ops);
        ASSERT_EQ(int(pairs.size()), 2 * (m - 2 * p + r + 1) + (p - r - 1))
            << "p " << p << " m " << m << " stage " << r;
        for (const pp::OpPair& x : pairs) {
          const Op &f = ops[x.forward], &b = ops[x.backward];
          EXPECT_EQ(f.kind, Op::forward);
          EXPECT_EQ(b.kind, Op::backward_input);
          EXPECT_NE(f.chunk, b.chunk);
          EXPECT_NE(f.micro, b.micro);
          for (size_t k = x.begin; k < x.end; ++k)
            if (k != x.forward && k != x.backward) EXPECT_FALSE(ops[k].is_compute());
        }
      }
      EXPECT_TRUE(pp::completes_with_grouped_pairs(sched)) << "p " << p << " m " << m;
      ++shapes;
    }
  EXPECT_GT(shapes, 100);
  // No other kind pairs.
  const ScheduleShape zbv{2, 4, 2, PipeSchedule::zb_v};
  EXPECT_TRUE(pp::op_pairs(zbv, pp::make_schedule(zbv).stages[0]).empty());
}

// The two passes alternate at each switch, the first from its start; once one has ended the
// other runs on without switching.
TEST(PassPair, AlternatesAtEachSwitch) {
  PassPair pair;
  std::string order;
  for (int round = 0; round < 2; ++round) {
    order.clear();
    pair.run(
        [&] {
          order += "a1 ";
          pair.give_way();
          order += "a2 ";
          pair.give_way();
          order += "a3 ";
          pair.give_way();
          order += "a4 ";
        },
        [&] {
          order += "b1 ";
          pair.give_way();
          order += "b2 ";
        });
    EXPECT_EQ(order, "a1 b1 a2 b2 a3 a4 ");
  }
  EXPECT_EQ(pair.pairs(), 2);
  EXPECT_EQ(pair.switches(), 6);  // a1, b1, a2 per run; a3 finds b ended
  EXPECT_FALSE(pair.running());
}

// let_other_finish: what follows comes after the whole other pass.
TEST(PassPair, LetsTheOtherFinish) {
  PassPair pair;
  std::string order;
  pair.run(
      [&] {
        order += "f1 ";
        pair.give_way();
        order += "f2 ";
        pair.give_way();
        order += "f3 ";
      },
      [&] {
        order += "b1 ";
        pair.let_other_finish();
        order += "b2 ";
      });
  EXPECT_EQ(order, "f1 b1 f2 f3 b2 ");
}

// Each pass keeps its own stack across the switches, and an OpenMP region runs inside a pass.
TEST(PassPair, KeepsEachStackAndRunsOpenMp) {
  PassPair pair;
  double sums[2] = {0, 0};
  auto pass = [&](int i) {
    std::vector<double> local(1000, double(i + 1));
    for (int k = 0; k < 3; ++k) {
      double s = 0;
#pragma omp parallel for reduction(+ : s)
      for (int j = 0; j < 1000; ++j) s += local[size_t(j)];
      sums[i] += s;
      pair.give_way();
    }
  };
  pair.run([&] { pass(0); }, [&] { pass(1); });
  EXPECT_EQ(sums[0], 3000.0);
  EXPECT_EQ(sums[1], 6000.0);
}

TEST(PassPair, RethrowsAPassError) {
  PassPair pair;
  EXPECT_THROW(
      pair.run([&] { pair.give_way(); }, [&] { throw std::runtime_error("second pass failed"); }),
      std::runtime_error);
  EXPECT_FALSE(pair.running());
  int ran = 0;
  pair.run([&] { ++ran; }, [&] { ++ran; });  // usable again
  EXPECT_EQ(ran, 2);
}

}  // namespace
}  // namespace tessera
