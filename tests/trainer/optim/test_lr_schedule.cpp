// The learning-rate schedule (trainer/optim/lr_schedule.h) at hand-computed points.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "common/error.h"
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

// A resume that moves the schedule's end (decay_steps 110 → 210 at step 60) continues from the
// checkpoint's learning rate at step 60 to min_lr at 210: no jump at 60, the new end reached, the
// shape kept (halfway through the rest: halfway between the two), and the continuation recorded so
// that a later resume with the same recipe keeps it.
TEST(LrSchedule, AResumeThatMovesTheEndContinuesWithoutAJump) {
  for (LrSchedule s : {LrSchedule::cosine, LrSchedule::linear}) {
    const OptimizerConfig before = config(s);
    OptimizerConfig after = before;
    after.decay_steps = 210;
    const double at60 = lr_at(before, 60);
    LrScheduler moved(after);
    const std::string line = moved.restore(LrScheduler(before).state(), 60);
    EXPECT_NE(line.find("its end moved from step 110 to 210"), std::string::npos) << line;
    EXPECT_DOUBLE_EQ(moved.at(60), at60);
    EXPECT_NE(lr_at(after, 60), at60);  // the recipe's schedule alone would jump
    EXPECT_NEAR(moved.at(135), 0.1 + (at60 - 0.1) / 2, 1e-12);
    EXPECT_DOUBLE_EQ(moved.at(210), 0.1);
    EXPECT_DOUBLE_EQ(moved.at(59), lr_at(after, 59));  // before the resume: as written
    // Cut short instead (110 → 80): from step 60 down to min_lr at 80.
    OptimizerConfig shorter = before;
    shorter.decay_steps = 80;
    LrScheduler cut(shorter);
    cut.restore(LrScheduler(before).state(), 60);
    EXPECT_DOUBLE_EQ(cut.at(60), at60);
    EXPECT_DOUBLE_EQ(cut.at(80), 0.1);
    // Resumed again later with the same recipe: the continuation is the run's state.
    LrScheduler again(after);
    EXPECT_EQ(again.restore(moved.state(), 100), "");
    EXPECT_DOUBLE_EQ(again.at(100), moved.at(100));
  }
}

// A change of the schedule's values (lr here) applies as written from the resume step; a resume
// inside the warmup needs no continuation (the warmup does not depend on the end); an unchanged
// schedule and a checkpoint that records none say nothing.
TEST(LrSchedule, OtherChangesApplyAsWritten) {
  const OptimizerConfig before = config(LrSchedule::cosine);
  OptimizerConfig higher = before;
  higher.lr = 2.0;
  LrScheduler s(higher);
  EXPECT_NE(s.restore(LrScheduler(before).state(), 60).find("this recipe's from step 60"), std::string::npos);
  EXPECT_DOUBLE_EQ(s.at(60), lr_at(higher, 60));
  OptimizerConfig longer = before;
  longer.decay_steps = 210;
  LrScheduler w(longer);
  w.restore(LrScheduler(before).state(), 5);
  for (int64_t step : {5, 9, 10, 100, 210}) EXPECT_DOUBLE_EQ(w.at(step), lr_at(longer, step)) << step;
  LrScheduler same(before);
  EXPECT_EQ(same.restore(LrScheduler(before).state(), 60), "");
  EXPECT_EQ(same.restore(nlohmann::json(), 60), "");
  EXPECT_DOUBLE_EQ(same.at(60), lr_at(before, 60));
}

// The manifest's schedule is read as hostile: each bad value is an error naming its field.
TEST(LrSchedule, ADamagedRecordIsAnErrorNamingTheField) {
  const nlohmann::json good = LrScheduler(config(LrSchedule::cosine)).state();
  const std::vector<std::pair<nlohmann::json, std::string>> bad = {
      {[&] {
         auto j = good;
         j["lr"] = "x";
         return j;
       }(),
       "lr_schedule.lr: expected a number"},
      {[&] {
         auto j = good;
         j["min_lr"] = -1;
         return j;
       }(),
       "lr_schedule.min_lr: expected a finite number"},
      {[&] {
         auto j = good;
         j["decay_steps"] = 0;
         return j;
       }(),
       "lr_schedule.decay_steps"},
      {[&] {
         auto j = good;
         j["warmup"] = 1.5;
         return j;
       }(),
       "lr_schedule.warmup"},
      {[&] {
         auto j = good;
         j["schedule"] = "cubic";
         return j;
       }(),
       "expected cosine, linear or constant"},
      {[&] {
         auto j = good;
         j["from"] = 61;
         j["from_lr"] = 0.5;
         return j;
       }(),
       "lr_schedule.from"},
      {nlohmann::json::array(), "expected an object"},
  };
  for (const auto& [j, want] : bad) {
    LrScheduler s(config(LrSchedule::cosine));
    try {
      s.restore(j, 60);
      ADD_FAILURE() << "accepted " << j.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

}  // namespace llmtrain::trainer
