// The learning-rate schedule (optim/lr_schedule.hpp): linear warmup to the peak, then a
// cosine decay that reaches min_lr at the last step (doc/model.md, "Optimizer").
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "optim/lr_schedule.hpp"

namespace tessera {
namespace {

constexpr double kTol = 1e-15;

TEST(LrSchedule, LinearWarmupToThePeak) {
  const LrSchedule s{1e-3, 1e-4, 10, 110};
  EXPECT_NEAR(s.at(1), 1e-4, kTol);  // lr * 1/10
  EXPECT_NEAR(s.at(5), 5e-4, kTol);
  EXPECT_NEAR(s.at(9), 9e-4, kTol);
  EXPECT_NEAR(s.at(10), 1e-3, kTol);  // the peak, at the last warmup step
  for (int64_t k = 1; k < 10; ++k) EXPECT_LT(s.at(k), s.at(k + 1)) << k;
}

TEST(LrSchedule, CosineFromPeakToMinLr) {
  const double lr = 1e-3, min_lr = 1e-4;
  const LrSchedule s{lr, min_lr, 10, 110};
  // progress p = (s - warmup) / (total - warmup); lr(p) = min + (lr - min)(1 + cos(pi p)) / 2.
  EXPECT_NEAR(s.at(60), 0.5 * (lr + min_lr), kTol);  // midpoint
  EXPECT_NEAR(s.at(35), min_lr + 0.5 * (lr - min_lr) * (1 + std::cos(M_PI / 4)), kTol);
  EXPECT_NEAR(s.at(85), min_lr + 0.5 * (lr - min_lr) * (1 + std::cos(3 * M_PI / 4)), kTol);
  EXPECT_NEAR(s.at(110), min_lr, kTol);  // the last step
  EXPECT_NEAR(s.at(200), min_lr, kTol);  // past the end it stays there
  EXPECT_LT(s.at(11), lr);
  EXPECT_GT(s.at(11), s.at(12));
  for (int64_t k = 10; k < 110; ++k) EXPECT_GE(s.at(k), s.at(k + 1)) << k;
  for (int64_t k = 1; k <= 110; ++k) {
    EXPECT_GE(s.at(k), min_lr * (1 - 1e-12)) << k;
    EXPECT_LE(s.at(k), lr * (1 + 1e-12)) << k;
  }
}

TEST(LrSchedule, NoWarmup) {
  const double lr = 3e-4, min_lr = 3e-5;
  const LrSchedule s{lr, min_lr, 0, 100};
  // The cosine starts at step 0: step 1 is already one step into the decay.
  EXPECT_NEAR(s.at(1), min_lr + 0.5 * (lr - min_lr) * (1 + std::cos(M_PI / 100)), kTol);
  EXPECT_NEAR(s.at(50), 0.5 * (lr + min_lr), kTol);
  EXPECT_NEAR(s.at(100), min_lr, kTol);
  for (int64_t k = 1; k <= 100; ++k) EXPECT_TRUE(std::isfinite(s.at(k))) << k;
}

TEST(LrSchedule, DegenerateLengths) {
  // Warmup as long as the run: the last step is the peak, and nothing divides by zero after.
  const LrSchedule all_warmup{1e-3, 1e-4, 20, 20};
  EXPECT_NEAR(all_warmup.at(20), 1e-3, kTol);
  EXPECT_NEAR(all_warmup.at(21), 1e-4, kTol);
  // min_lr = lr: constant after warmup.
  const LrSchedule flat{2e-4, 2e-4, 3, 50};
  for (int64_t k = 3; k <= 50; ++k) EXPECT_NEAR(flat.at(k), 2e-4, kTol) << k;
}

}  // namespace
}  // namespace tessera
