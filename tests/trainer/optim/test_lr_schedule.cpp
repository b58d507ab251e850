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
  for (LrSchedule s : {LrSchedule::cosine, LrSchedule::linear, LrSchedule::constant, LrSchedule::wsd}) {
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

// Warmup-stable-decay at every step against its formula: warmup 10, lr until step 90 (the last 20
// of 110: wsd_decay_steps 20, or a fraction 2/11), then 1 − √p or linear down to min_lr.
TEST(LrSchedule, WsdIsStableThenDecaysOverItsLastSteps) {
  for (WsdShape shape : {WsdShape::one_minus_sqrt, WsdShape::linear}) {
    for (bool by_steps : {false, true}) {
      OptimizerConfig o = config(LrSchedule::wsd);
      o.wsd_shape = shape;
      if (by_steps)
        o.wsd_decay_steps = 20;
      else
        o.wsd_decay_fraction = 20.0 / 110.0;
      EXPECT_EQ(o.wsd_decay_length(), 20);
      EXPECT_EQ(o.wsd_decay_start(), 90);
      for (int64_t s = 0; s < 130; ++s) {
        double want = 0.1;
        if (s < 10) {
          want = double(s + 1) / 10.0;
        } else if (s < 90) {
          want = 1.0;
        } else if (s < 110) {
          const double p = double(s - 90) / 20.0;
          want = shape == WsdShape::linear ? 1.0 - 0.9 * p : 0.1 + 0.9 * (1.0 - std::sqrt(p));
        }
        EXPECT_NEAR(lr_at(o, s), want, 1e-12) << "step " << s;
      }
    }
  }
  OptimizerConfig tiny = config(LrSchedule::wsd);
  tiny.decay_steps = 12, tiny.warmup = 0, tiny.wsd_decay_fraction = 0.01;  // 0.12 steps rounds to 0: at least 1
  EXPECT_EQ(tiny.wsd_decay_length(), 1);
  EXPECT_DOUBLE_EQ(lr_at(tiny, 10), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(tiny, 11), 1.0);  // p = 0 at the decay's first (and only) step
  EXPECT_DOUBLE_EQ(lr_at(tiny, 12), 0.1);
}

// A wsd run resumed in its stable phase with more steps (110 → 210, the decay its last fifth) keeps
// lr and decays over the longer run's last 42 steps: the curve a 210-step run has from the start.
// Resumed inside the decay instead, it continues from where the checkpoint's decay had it.
TEST(LrSchedule, AWsdRunExtendedInItsStablePhaseContinuesOnTheLongerCurve) {
  const OptimizerConfig before = config(LrSchedule::wsd);
  OptimizerConfig after = before;
  after.decay_steps = 210;
  LrScheduler extended(after);
  const std::string line = extended.restore(LrScheduler(before).state(), 60);
  EXPECT_NE(line.find("in the stable phase: lr 1 until step 168"), std::string::npos) << line;
  for (int64_t s = 60; s < 230; ++s) EXPECT_DOUBLE_EQ(extended.at(s), lr_at(after, s)) << s;
  EXPECT_EQ(extended.state().value("from", -1), -1);
  // In the decay (step 100 of the 90-110 decay): from its value there to min_lr at 210.
  LrScheduler late(after);
  late.restore(LrScheduler(before).state(), 100);
  EXPECT_DOUBLE_EQ(late.at(100), lr_at(before, 100));
  EXPECT_NEAR(late.at(155), 0.1 + (lr_at(before, 100) - 0.1) * (1.0 - std::sqrt(0.5)), 1e-12);
  EXPECT_DOUBLE_EQ(late.at(210), 0.1);
  // Another shape is a change of the schedule: applied as written.
  OptimizerConfig other = before;
  other.wsd_shape = WsdShape::linear;
  LrScheduler changed(other);
  EXPECT_NE(changed.restore(LrScheduler(before).state(), 100).find("this recipe's from step 100"), std::string::npos);
  // A damaged record of the decay is an error naming it.
  nlohmann::json damaged = LrScheduler(before).state();
  damaged["wsd_shape"] = "cubic";
  try {
    LrScheduler(before).restore(damaged, 60);
    ADD_FAILURE() << "a wsd_shape cubic accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the wsd decay"), std::string::npos) << e.what();
  }
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
       "expected cosine, linear, constant or wsd"},
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
