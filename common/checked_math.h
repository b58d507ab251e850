// Arithmetic on sizes, counts and offsets read from files we did not write (safetensors headers,
// manifests, indexed datasets): a product or sum that does not fit in 64 bits must be an error, never
// a wrapped value (a shape whose element count wraps to 0 would be taken as an empty tensor and
// pass every comparison over it). Signed overflow is also undefined behaviour.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

namespace llmtrain {

// a × b and a + b, or nullopt when the exact result does not fit in int64_t.
inline std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<int64_t> checked_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// The element count of a shape: nullopt when a dimension is negative or the product of all of them
// (taken left to right, as the safetensors reference does, so [2^40, 2^40, 0] is refused too)
// exceeds INT64_MAX.
inline std::optional<int64_t> checked_product(std::span<const int64_t> dims) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0) return std::nullopt;
    auto next = checked_mul(n, d);
    if (!next) return std::nullopt;
    n = *next;
  }
  return n;
}

}  // namespace llmtrain
