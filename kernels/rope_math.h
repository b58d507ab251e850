// The rotary frequencies (ops.h's RopeScaling), written once for both backends' rope_table
// (kernels/cpu/rope.cpp and kernels/cuda/rope.cu): both build the table in double from these.
//
// The rule a reader could get wrong: YaRN's pair range [low, high] depends only on the head size
// and the scaling, not on the pair, and transformers floors and ceils it (truncate) before the
// ramp; a range computed per pair without that rounding gives other frequencies in the blend.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/host_device.h"
#include "kernels/ops.h"

namespace llmtrain::kernels {

// YaRN's pair index at which a frequency turns `rotations` times over original_max_positions.
LT_HOST_DEVICE double yarn_correction_pair(double rotations, int64_t d, double theta, double original) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  return double(d) * log(original / (rotations * kTwoPi)) / (2 * log(theta));
}

// YaRN's ramp at pair i: 0 below the correction range (the frequency kept), 1 above it (divided
// by factor), linear between.
LT_HOST_DEVICE double yarn_ramp(int64_t i, int64_t d, double theta, const RopeScaling& s) {
  double low = yarn_correction_pair(s.beta_fast, d, theta, s.original_max_positions);
  double high = yarn_correction_pair(s.beta_slow, d, theta, s.original_max_positions);
  if (s.truncate) {
    low = floor(low);
    high = ceil(high);
  }
  low = low > 0 ? low : 0;
  high = high < double(d - 1) ? high : double(d - 1);
  if (low == high) high += 0.001;  // as transformers: no division by zero
  const double r = (double(i) - low) / (high - low);
  return r < 0 ? 0 : r > 1 ? 1 : r;
}

// The frequency of pair i of a head of d values, stretched as RopeScaling says.
LT_HOST_DEVICE double scaled_inv_freq(int64_t i, int64_t d, double theta, const RopeScaling& s) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  const double f = pow(theta, -double(2 * i) / double(d));
  switch (s.type) {
    case RopeScaling::Type::none:
      return f;
    case RopeScaling::Type::linear:
      return f / s.factor;
    case RopeScaling::Type::llama3: {
      const double wavelen = kTwoPi / f;
      if (wavelen > s.original_max_positions / s.low_freq_factor) return f / s.factor;
      if (wavelen < s.original_max_positions / s.high_freq_factor) return f;
      const double smooth =
          (s.original_max_positions / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      return (1 - smooth) * f / s.factor + smooth * f;
    }
    case RopeScaling::Type::yarn: {
      const double ramp = yarn_ramp(i, d, theta, s);
      return (1 - ramp) * f + ramp * f / s.factor;
    }
  }
  return f;
}

// What every cos and sin of the table is multiplied by.
LT_HOST_DEVICE double rope_table_scale(const RopeScaling& s) {
  return s.type == RopeScaling::Type::yarn ? s.attention_factor : 1.0;
}

}  // namespace llmtrain::kernels
