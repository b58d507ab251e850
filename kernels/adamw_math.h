// One element of AdamW's update, written once for both backends (kernels/cpu/adamw.cpp and
// kernels/cuda/adamw.cu; kernels/op_table.def states the update).
//
// The rule a reader could get wrong: every multiply-add is an explicit fmaf and nothing else is
// left as a·b + c, so no compiler may fuse it another way (the CPU ops build with
// -ffp-contract=fast, nvcc contracts by default, and the device's grouped loop and the CPU's loop
// would pick different pairs). fmaf, the division and sqrtf are correctly rounded on the CPU, in
// the simulator and on a GPU (nvcc's default -prec-div, -prec-sqrt), so the update is the same bits
// on every device.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "kernels/host_device.h"

namespace llmtrain::kernels {

// The step's constants: grad_scale, β1, β2, eps, the decay factor of this element's row (1 or
// 1 − lr·wd), lr / (1 − β1^t) and 1 / √(1 − β2^t).
struct AdamWConstants {
  float grad_scale, b1, b2, eps, step_size, inv_sqrt_bc2;
};

// p, m, v updated in place from the gradient g as stored (read as fp32).
LT_HOST_DEVICE void adamw_element(const AdamWConstants& c, float decay, float g, float& p, float& m, float& v) {
  const float gi = g * c.grad_scale;
  m = fmaf(c.b1, m, (1.0f - c.b1) * gi);
  v = fmaf(c.b2, v, ((1.0f - c.b2) * gi) * gi);
  const float step = c.step_size * m / fmaf(sqrtf(v), c.inv_sqrt_bc2, c.eps);
  p = fmaf(p, decay, -step);
}

// bf16 parameters without an fp32 master (optimizer.master false) take the update rounded
// stochastically: up with probability (x − down) / (up − down), so that updates smaller than half
// a bf16 ulp still move the parameter on average instead of vanishing. The 16 random bits of an
// element are a counter-based hash (splitmix64's finalizer) of the step's key and the element's
// index in the flat parameter buffer: the same bits for a given seed, step and layout on every
// backend, whatever the threads' order.
LT_HOST_DEVICE uint64_t splitmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The step's key, from the recipe's seed and the 1-based update count.
LT_HOST_DEVICE uint64_t rounding_key(uint64_t seed, int64_t step) {
  return splitmix64(seed * 0x9E3779B97F4A7C15ull + uint64_t(step));
}

LT_HOST_DEVICE uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  return std::bit_cast<uint32_t>(x);
#endif
}

// A bf16 bit pattern widened to fp32 (exact).
LT_HOST_DEVICE float bf16_bits_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(uint32_t(h) << 16);
#else
  return std::bit_cast<float>(uint32_t(h) << 16);
#endif
}

// x rounded to bf16 with element `index`'s random bits under `key`. Adding 16 random bits below the
// kept 16 and truncating rounds the magnitude up with probability (dropped bits) / 2^16; ±inf and
// NaN keep their pattern (NaN forced quiet).
LT_HOST_DEVICE uint16_t fp32_to_bf16_stochastic(float x, uint64_t key, int64_t index) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return uint16_t((u >> 16) | ((u & 0x7fffffu) != 0 ? 0x0040u : 0u));
  const uint32_t r = uint32_t(splitmix64(key + uint64_t(index) * 0xD1B54A32D192ED03ull)) & 0xffffu;
  return uint16_t((u + r) >> 16);
}

}  // namespace llmtrain::kernels
