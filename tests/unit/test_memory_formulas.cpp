// ZeRO model-state formulas (src/perf/memory.hpp) against the ZeRO paper's worked example
// and the per-parameter bytes of each stage.
#include <gtest/gtest.h>

#include "perf/memory.hpp"

namespace tessera {
namespace {

TEST(ZeroMemory, PaperExampleMixedPrecision) {
  // Rajbhandari et al. 2020, Figure 1: Psi = 7.5B, N = 64 -> 120, 31.4, 16.6, 1.9 GB.
  const double psi = 7.5e9, n = 64;
  const double expected[] = {120.0, 31.4, 16.6, 1.9};
  for (int stage = 0; stage <= 3; ++stage)
    EXPECT_NEAR(zero_model_state(stage, psi, n, true).total() / 1e9,
                expected[stage], 0.05)
        << "stage " << stage;
}

TEST(ZeroMemory, Fp32BytesPerParameter) {
  // With N = 4: 16, 8 + 3, 4 + 3, 4 bytes per parameter.
  const double per_param[] = {16.0, 11.0, 7.0, 4.0};
  for (int stage = 0; stage <= 3; ++stage)
    EXPECT_DOUBLE_EQ(zero_model_state(stage, 1.0, 4.0, false).total(),
                     per_param[stage]);
  // Adam moments never depend on the gradient or parameter sharding.
  EXPECT_DOUBLE_EQ(zero_model_state(1, 1.0, 4.0, false).optimizer, 2.0);
  EXPECT_DOUBLE_EQ(zero_model_state(0, 1.0, 4.0, false).optimizer, 8.0);
}

TEST(ZeroMemory, SevenBillionAdamIs112GB) {
  // 7B parameters with Adam in mixed precision: 16 bytes each.
  EXPECT_DOUBLE_EQ(zero_model_state(0, 7e9, 1, true).total() / 1e9, 112.0);
}

}  // namespace
}  // namespace tessera
