#include "trainer/optim/lr_schedule.h"

#include <fmt/format.h>

#include <cmath>
#include <numbers>

#include "common/enum_names.h"
#include "common/error.h"
#include "common/json_integer.h"
#include "common/strings.h"

namespace llmtrain::trainer {
namespace {

constexpr const char* kDamaged = "the checkpoint's manifest.json is damaged";

// The decay from `from_lr` at step `from` to min_lr at decay_steps, in the schedule's shape.
double decay(const OptimizerConfig& opt, int64_t from, double from_lr, int64_t step) {
  if (step >= opt.decay_steps) return opt.min_lr;
  const double p = double(step - from) / double(opt.decay_steps - from);
  if (opt.schedule == LrSchedule::linear) return from_lr - (from_lr - opt.min_lr) * p;
  return opt.min_lr + (from_lr - opt.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
}

double saved_number(const nlohmann::json& j, const char* key) {
  const std::string where = fmt::format("manifest extra.lr_schedule.{}", key);
  if (!j.contains(key) || !j.at(key).is_number()) throw Error(fmt::format("{}: expected a number", where), kDamaged);
  const double v = j.at(key).get<double>();
  if (!std::isfinite(v) || v < 0)
    throw Error(fmt::format("{}: expected a finite number ≥ 0, found {}", where, v), kDamaged);
  return v;
}

}  // namespace

double lr_at(const OptimizerConfig& opt, int64_t step) {
  LT_CHECK(opt.decay_steps > 0 && step >= 0, "lr_at step {} with decay_steps {}", step, opt.decay_steps);
  const int64_t w = opt.warmup;
  if (step < w) return opt.lr * double(step + 1) / double(w);
  if (opt.schedule == LrSchedule::constant) return opt.lr;
  return decay(opt, w, opt.lr, step);
}

LrScheduler::LrScheduler(const OptimizerConfig& opt) : opt_(opt) {}

double LrScheduler::at(int64_t step) const {
  if (from_ < 0 || step < from_) return lr_at(opt_, step);
  return decay(opt_, from_, from_lr_, step);
}

nlohmann::json LrScheduler::state() const {
  nlohmann::json j = {{"lr", opt_.lr},
                      {"min_lr", opt_.min_lr},
                      {"warmup", opt_.warmup},
                      {"decay_steps", opt_.decay_steps},
                      {"schedule", to_string(opt_.schedule)}};
  if (from_ >= 0) j.update({{"from", from_}, {"from_lr", from_lr_}});
  return j;
}

std::string LrScheduler::restore(const nlohmann::json& saved, int64_t step) {
  from_ = -1;
  if (saved.is_null()) return "";
  if (!saved.is_object()) throw Error("manifest extra.lr_schedule: expected an object", kDamaged);
  // The checkpoint's schedule, with its own continuation.
  OptimizerConfig before = opt_;
  before.lr = saved_number(saved, "lr");
  before.min_lr = saved_number(saved, "min_lr");
  const int64_t kMaxSteps = int64_t(1) << 50;
  auto integer = [&](const char* key, int64_t lo, int64_t hi) {
    return json_integer(saved.value(key, nlohmann::json()), fmt::format("manifest extra.lr_schedule.{}", key), kDamaged,
                        lo, hi);
  };
  before.warmup = integer("warmup", 0, kMaxSteps);
  before.decay_steps = integer("decay_steps", 1, kMaxSteps);
  const nlohmann::json kind = saved.value("schedule", nlohmann::json());
  const std::optional<LrSchedule> parsed =
      kind.is_string() ? enum_value(enum_names(LrSchedule{}), kind.get<std::string>()) : std::nullopt;
  if (!parsed)
    throw Error(fmt::format("manifest extra.lr_schedule.schedule: expected cosine, linear or constant, found {}",
                            printable(kind.dump())),
                kDamaged);
  before.schedule = *parsed;
  LrScheduler was(before);
  if (saved.contains("from")) {
    was.from_ = integer("from", 0, step);
    was.from_lr_ = saved_number(saved, "from_lr");
  }
  const bool same_shape = before.lr == opt_.lr && before.min_lr == opt_.min_lr && before.warmup == opt_.warmup &&
                          before.schedule == opt_.schedule;
  if (same_shape && before.decay_steps == opt_.decay_steps) {
    from_ = was.from_;
    from_lr_ = was.from_lr_;
    return "";
  }
  const double then = was.at(step), plain = lr_at(opt_, step);
  if (same_shape && opt_.schedule != LrSchedule::constant && step >= opt_.warmup) {
    from_ = step;
    from_lr_ = then;
    return fmt::format(
        "learning-rate schedule: its end moved from step {} to {}: from step {} it continues from {:.4g} to min_lr "
        "{:.4g} at step {} (this recipe's schedule alone would jump to {:.4g})",
        before.decay_steps, opt_.decay_steps, step, then, opt_.min_lr, opt_.decay_steps, plain);
  }
  return fmt::format("learning-rate schedule: this recipe's from step {}: {:.4g} there (the checkpoint's gave {:.4g})",
                     step, plain, then);
}

}  // namespace llmtrain::trainer
