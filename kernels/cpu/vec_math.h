// Branch-free float math that GCC vectorizes inside `#pragma omp simd` loops (libm's expf/tanhf
// do not vectorize, and the softmaxes and GELUs of a step evaluate tens of millions of them).
//
// Rule a reader could get wrong: exp_approx is accurate to ~2 ulp over its range but flushes
// results below ~2^-126 to 0 (inputs below -87.3), so a masked score of -inf gives exactly 0.
// NaN inputs give unspecified finite-or-NaN values: callers that must propagate NaN (the loss)
// check their inputs separately.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace llmtrain::kernels::cpu {

#pragma omp declare simd notinbranch
inline float exp_approx(float x) {
  // exp(x) = 2^n · exp(r), n = round(x / ln 2), |r| <= ln2 / 2 (Cody-Waite reduction: n·kLn2Hi is
  // exact because kLn2Hi has 9 significant bits and |n| <= 127).
  constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 · 2^23: adding it rounds to an integer in the low bits
  float xc = std::min(std::max(x, -88.0f), 88.0f);
  float shifted = xc * kLog2e + kRound;
  float n = shifted - kRound;
  int32_t ni = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRound);
  float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  // Taylor series to r^7: truncation error < 6e-9 relative on |r| <= 0.347.
  float p = 1.0f / 5040.0f;
  p = std::fma(p, r, 1.0f / 720.0f);
  p = std::fma(p, r, 1.0f / 120.0f);
  p = std::fma(p, r, 1.0f / 24.0f);
  p = std::fma(p, r, 1.0f / 6.0f);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  float scale = std::bit_cast<float>((ni + 127) << 23);  // 2^n; n = -127 encodes 0
  return p * scale;
}

// 1 / (1 + e^{-x})
#pragma omp declare simd notinbranch
inline float sigmoid_approx(float x) { return 1.0f / (1.0f + exp_approx(-x)); }

}  // namespace llmtrain::kernels::cpu
