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
  const bool linear =
      opt.schedule == LrSchedule::linear || (opt.schedule == LrSchedule::wsd && opt.wsd_shape == WsdShape::linear);
  if (linear) return from_lr - (from_lr - opt.min_lr) * p;
  if (opt.schedule == LrSchedule::wsd) return opt.min_lr + (from_lr - opt.min_lr) * (1.0 - std::sqrt(p));
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
  if (opt.schedule == LrSchedule::wsd) {
    const int64_t start = opt.wsd_decay_start();
    return step < start ? opt.lr : decay(opt, start, opt.lr, step);
  }
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
  if (opt_.schedule == LrSchedule::wsd)
    j.update({{"wsd_decay_steps", opt_.wsd_decay_steps},
              {"wsd_decay_fraction", opt_.wsd_decay_fraction},
              {"wsd_shape", to_string(opt_.wsd_shape)}});
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
    throw Error(fmt::format("manifest extra.lr_schedule.schedule: expected cosine, linear, constant or wsd, found {}",
                            printable(kind.dump())),
                kDamaged);
  before.schedule = *parsed;
  if (before.schedule == LrSchedule::wsd) {
    before.wsd_decay_steps = integer("wsd_decay_steps", 0, before.decay_steps);
    before.wsd_decay_fraction = saved_number(saved, "wsd_decay_fraction");
    const nlohmann::json shape = saved.value("wsd_shape", nlohmann::json());
    const std::optional<WsdShape> s =
        shape.is_string() ? enum_value(enum_names(WsdShape{}), shape.get<std::string>()) : std::nullopt;
    if (!s || !(before.wsd_decay_fraction > 0 && before.wsd_decay_fraction <= 1) ||
        before.wsd_decay_start() < before.warmup)
      throw Error(fmt::format("manifest extra.lr_schedule: the wsd decay {} (fraction {}, shape {}) does not fit "
                              "between warmup {} and decay_steps {}",
                              before.wsd_decay_steps, before.wsd_decay_fraction, printable(shape.dump()), before.warmup,
                              before.decay_steps),
                  kDamaged);
    before.wsd_shape = *s;
  }
  LrScheduler was(before);
  if (saved.contains("from")) {
    was.from_ = integer("from", 0, step);
    was.from_lr_ = saved_number(saved, "from_lr");
  }
  const bool same_shape = before.lr == opt_.lr && before.min_lr == opt_.min_lr && before.warmup == opt_.warmup &&
                          before.schedule == opt_.schedule &&
                          (opt_.schedule != LrSchedule::wsd || (before.wsd_decay_steps == opt_.wsd_decay_steps &&
                                                                before.wsd_decay_fraction == opt_.wsd_decay_fraction &&
                                                                before.wsd_shape == opt_.wsd_shape));
  if (same_shape && before.decay_steps == opt_.decay_steps) {
    from_ = was.from_;
    from_lr_ = was.from_lr_;
    return "";
  }
  const double then = was.at(step), plain = lr_at(opt_, step);
  // wsd's stable phase, in both: nothing has decayed yet, so the new end only moves the decay.
  if (same_shape && opt_.schedule == LrSchedule::wsd && was.from_ < 0 && step < before.wsd_decay_start() &&
      step < opt_.wsd_decay_start())
    return fmt::format(
        "learning-rate schedule: its end moved from step {} to {} in the stable phase: lr {:.4g} until step {}, then "
        "the decay to min_lr {:.4g} at step {}",
        before.decay_steps, opt_.decay_steps, opt_.lr, opt_.wsd_decay_start(), opt_.min_lr, opt_.decay_steps);
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
