// Scalar conversions between fp32 and the 16-bit float formats (bf16, IEEE fp16), stored as
// uint16_t bit patterns. Used by checkpoint I/O, export/import and the bulk `convert` op.
//
// Rule a reader could get wrong: fp32 -> 16-bit rounds to nearest, ties to even (what PyTorch,
// NumPy and the hardware instructions do), not by truncation. NaN stays NaN (quiet, same sign);
// fp32 values beyond fp16's range become ±inf; tiny values become fp16 subnormals or ±0.
#pragma once

#include <bit>
#include <cstdint>

namespace llmtrain::kernels {

inline float bf16_to_fp32(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

inline uint16_t fp32_to_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x0040u);  // NaN: force quiet
  x += 0x7fffu + ((x >> 16) & 1u);  // round half to even; a carry correctly bumps the exponent
  return uint16_t(x >> 16);
}

inline float fp16_to_fp32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // ±0 or a subnormal: mant · 2^-24, exact in fp32.
    float v = float(mant) * 5.9604644775390625e-08f;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(v) | sign);
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // inf, NaN
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t fp32_to_fp16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));  // NaN, quiet
  if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);                         // >= 65520 rounds to inf
  if (ax < 0x38800000u) {
    // Below fp16's smallest normal 2^-14: a subnormal, in units of 2^-24. 2^-25 and below round
    // to zero (2^-25 itself is a tie and goes to the even 0).
    if (ax <= 0x33000000u) return sign;
    uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - (ax >> 23);  // 14..24
    uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;  // may carry into the smallest normal: correct
    return uint16_t(sign | q);
  }
  uint32_t r = ax - 0x38000000u;  // rebias the exponent from 127 to 15
  r += 0xfffu + ((r >> 13) & 1u);
  return uint16_t(sign | (r >> 13));
}

}  // namespace llmtrain::kernels
