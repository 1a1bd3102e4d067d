// GradBuckets: every combination of overlap on/off and parallel.progress poll/none sums the
// gradients over the data-parallel ranks, with one all-reduce per bucket, and records its
// timing (bucket count and bytes exact; times non-negative and consistent; polling only when
// it polls). Parameters are reported final in reverse registration order, as backward does.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <tuple>
#include <vector>

#include "parallel/dp/grad_buckets.hpp"

namespace tessera {
namespace {

class GradBucketsTest : public ::testing::TestWithParam<std::tuple<bool, DpProgress>> {};

TEST_P(GradBucketsTest, SumsOverRanksAndRecordsTiming) {
  const auto [overlap, progress] = GetParam();
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  Communicator dp(c, "dp");
  Allocator alloc;
  ParamStore store;
  // 6 parameters of 1000..6000 floats; buckets of ~8000 bytes hold 1 to 3 parameters.
  for (int i = 0; i < 6; ++i)
    store.add("p" + std::to_string(i), Shape{1000 * (i + 1)}, ParamInit{}, false);
  store.finalize(alloc);
  GradBuckets buckets(store, dp, 8000.0 / (1024 * 1024), overlap, progress);
  EXPECT_EQ(buckets.progress(), progress);
  const int64_t n = store.numel();
  const int P = dp.size();
  for (int step = 0; step < 2; ++step) {
    for (int64_t i = 0; i < n; ++i) store.grads()[i] = float(dp.rank() + 1) * float(i % 97);
    buckets.arm(false);  // an earlier micro-batch: nothing reduced
    for (int i = 5; i >= 0; --i) buckets.ready(i, i + 1);
    buckets.finish();
    EXPECT_EQ(dp.stats().calls, step * buckets.buckets());

    buckets.arm(true);
    for (int i = 5; i >= 0; --i) buckets.ready(i, i + 1);
    buckets.finish();
    const float ranks = float(P * (P + 1) / 2);
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += store.grads()[i] != ranks * float(i % 97);
    EXPECT_EQ(bad, 0);

    const DpSyncTiming& t = buckets.last_step();
    EXPECT_GT(buckets.buckets(), 2);
    EXPECT_EQ(t.buckets, buckets.buckets());
    EXPECT_EQ(t.bytes, n * 4);
    EXPECT_EQ(dp.stats().calls, (step + 1) * buckets.buckets());
    EXPECT_EQ(buckets.started_early(), overlap ? buckets.buckets() : 0);
    EXPECT_GE(t.exposed, 0.0);
    EXPECT_GE(t.in_flight, 0.0);
    if (!overlap || progress == DpProgress::none) EXPECT_EQ(t.polling, 0.0);
    if (!overlap) EXPECT_EQ(t.posting, 0.0);
    if (overlap) EXPECT_GT(t.posting, 0.0);
    // Without overlap every bucket is posted and completed inside finish().
    if (!overlap) EXPECT_LE(t.in_flight, t.exposed);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, GradBucketsTest,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(DpProgress::poll, DpProgress::none)));

TEST(DpProgressName, RoundTrips) {
  EXPECT_EQ(dp_progress_from("poll"), DpProgress::poll);
  EXPECT_EQ(dp_progress_from("none"), DpProgress::none);
  EXPECT_STREQ(to_string(DpProgress::none), "none");
  EXPECT_THROW(dp_progress_from("thread"), std::logic_error);
}

}  // namespace
}  // namespace tessera
