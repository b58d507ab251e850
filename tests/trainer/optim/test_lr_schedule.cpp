// The learning-rate schedule (trainer/optim/lr_schedule.h) at hand-computed points.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "trainer/optim/lr_schedule.h"

namespace llmtrain::trainer {

static OptimizerConfig config(LrSchedule s) {
  OptimizerConfig o;
  o.lr = 1.0, o.min_lr = 0.1, o.warmup = 10, o.decay_steps = 110, o.schedule = s;
  return o;
}

TEST(LrSchedule, LinearWarmupFromLrOverWarmup) {
  for (LrSchedule s : {LrSchedule::cosine, LrSchedule::linear, LrSchedule::constant}) {
    EXPECT_DOUBLE_EQ(lr_at(config(s), 0), 0.1);
    EXPECT_DOUBLE_EQ(lr_at(config(s), 4), 0.5);
    EXPECT_DOUBLE_EQ(lr_at(config(s), 9), 1.0);
  }
}

TEST(LrSchedule, CosineReachesMinLrAtDecaySteps) {
  const OptimizerConfig o = config(LrSchedule::cosine);
  EXPECT_DOUBLE_EQ(lr_at(o, 10), 1.0);
  EXPECT_NEAR(lr_at(o, 60), 0.55, 1e-12);  // halfway: min + (lr - min) / 2
  EXPECT_NEAR(lr_at(o, 35), 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 0.25)), 1e-12);
  EXPECT_DOUBLE_EQ(lr_at(o, 110), 0.1);
  EXPECT_DOUBLE_EQ(lr_at(o, 5000), 0.1);
}

TEST(LrSchedule, LinearAndConstant) {
  EXPECT_NEAR(lr_at(config(LrSchedule::linear), 60), 0.55, 1e-12);
  EXPECT_NEAR(lr_at(config(LrSchedule::linear), 85), 1.0 - 0.9 * 0.75, 1e-12);
  EXPECT_DOUBLE_EQ(lr_at(config(LrSchedule::linear), 200), 0.1);
  EXPECT_DOUBLE_EQ(lr_at(config(LrSchedule::constant), 10), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(config(LrSchedule::constant), 5000), 1.0);
}

TEST(LrSchedule, NoWarmup) {
  OptimizerConfig o = config(LrSchedule::cosine);
  o.warmup = 0;
  EXPECT_DOUBLE_EQ(lr_at(o, 0), 1.0);
  EXPECT_NEAR(lr_at(o, 55), 0.55, 1e-12);
}

}  // namespace llmtrain::trainer
