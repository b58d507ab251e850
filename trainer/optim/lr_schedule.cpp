#include "trainer/optim/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "common/error.h"

namespace llmtrain::trainer {

double lr_at(const OptimizerConfig& opt, int64_t step) {
  LT_CHECK(opt.decay_steps > 0 && step >= 0, "lr_at step {} with decay_steps {}", step, opt.decay_steps);
  const int64_t w = opt.warmup, d = opt.decay_steps;
  if (step < w) return opt.lr * double(step + 1) / double(w);
  if (opt.schedule == LrSchedule::constant) return opt.lr;
  if (step >= d) return opt.min_lr;
  const double p = double(step - w) / double(d - w);
  if (opt.schedule == LrSchedule::linear) return opt.lr - (opt.lr - opt.min_lr) * p;
  return opt.min_lr + (opt.lr - opt.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
}

}  // namespace llmtrain::trainer
