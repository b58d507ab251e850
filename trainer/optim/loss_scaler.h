// fp16's dynamic loss scaler (Megatron's DynamicGradScaler rule; recipe keys train.loss_scale.*):
// the loss is multiplied by scale() before backward, so that small gradients survive in 16 bits,
// and the optimizer divides it out again. A step whose gradients overflow (inf or NaN anywhere, on
// any rank) is skipped, and update() then moves the scale:
//  - an overflow resets the count of good steps and spends one unit of hysteresis; once the
//    hysteresis is spent (it starts at train.loss_scale.hysteresis), this and every further
//    overflow multiply the scale by `backoff`, never below `min`;
//  - `growth_interval` good steps in a row double the scale and restore the hysteresis.
//
// Rule a reader could get wrong: the hysteresis is restored only when the scale grows, not after
// any good step; with hysteresis 2 the first overflow after a growth keeps the scale, the second
// (however far apart) halves it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "common/recipe/recipe.h"

namespace llmtrain::trainer {

class LossScaler {
 public:
  explicit LossScaler(const LossScaleConfig& config);

  double scale() const { return scale_; }
  // After a step with (found_overflow) or without an overflow; returns whether the scale changed.
  bool update(bool found_overflow);

  // What a checkpoint keeps: the scale, the good steps since the last change, the hysteresis left.
  nlohmann::json state() const;
  void restore(const nlohmann::json& state);

 private:
  LossScaleConfig config_;
  double scale_;
  int64_t good_steps_ = 0;
  int hysteresis_left_;
};

}  // namespace llmtrain::trainer
