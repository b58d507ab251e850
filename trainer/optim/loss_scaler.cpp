#include "trainer/optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/json_integer.h"

namespace llmtrain::trainer {

LossScaler::LossScaler(const LossScaleConfig& config)
    : config_(config), scale_(config.initial), hysteresis_left_(config.hysteresis) {
  LT_CHECK(config.initial > 0 && config.min > 0 && config.backoff > 0 && config.backoff < 1 &&
               config.growth_interval >= 1 && config.hysteresis >= 1,
           "loss scale config initial {} min {} backoff {} growth_interval {} hysteresis {}", config.initial,
           config.min, config.backoff, config.growth_interval, config.hysteresis);
}

bool LossScaler::update(bool found_overflow) {
  const double before = scale_;
  if (found_overflow) {
    good_steps_ = 0;
    hysteresis_left_ = std::max(hysteresis_left_ - 1, 0);
    if (hysteresis_left_ == 0) scale_ = std::max(scale_ * config_.backoff, config_.min);
  } else if (++good_steps_ == config_.growth_interval) {
    good_steps_ = 0;
    hysteresis_left_ = config_.hysteresis;
    scale_ *= 2;
  }
  return scale_ != before;
}

nlohmann::json LossScaler::state() const {
  return {{"scale", scale_}, {"good_steps", good_steps_}, {"hysteresis_left", hysteresis_left_}};
}

void LossScaler::restore(const nlohmann::json& state) {
  // From a manifest: checked, never cast (a float as an integer is undefined behaviour out of range).
  auto field = [&](const char* key) -> const nlohmann::json& {
    if (!state.is_object() || !state.contains(key))
      throw Error(fmt::format("the checkpoint's loss scale state has no {}", key), "the checkpoint is damaged");
    return state[key];
  };
  const nlohmann::json& scale = field("scale");
  if (!scale.is_number() || !std::isfinite(scale.get<double>()) || !(scale.get<double>() > 0))
    throw Error(fmt::format("the checkpoint's loss scale is {}, not a positive number", scale.dump()),
                "the checkpoint is damaged");
  scale_ = scale.get<double>();
  constexpr std::string_view kDamaged = "the manifest is damaged";
  good_steps_ = json_integer(field("good_steps"), "manifest extra.loss_scale.good_steps", kDamaged, 0);
  hysteresis_left_ =
      int(json_integer(field("hysteresis_left"), "manifest extra.loss_scale.hysteresis_left", kDamaged, 0, INT32_MAX));
}

}  // namespace llmtrain::trainer
