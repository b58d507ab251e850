#include "trainer/optim/loss_scaler.h"

#include <algorithm>

#include "common/error.h"

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
  scale_ = state.at("scale").get<double>();
  good_steps_ = state.at("good_steps").get<int64_t>();
  hysteresis_left_ = state.at("hysteresis_left").get<int>();
}

}  // namespace llmtrain::trainer
