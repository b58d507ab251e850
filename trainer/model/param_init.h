// Parameter initialization from a counter-based RNG, so that any shard of a parameter gets exactly
// the values the whole parameter would get: element g (row-major index into the parameter's
// GLOBAL shape) of parameter `name` is a pure function of (seed, name, g).
//
//   key     = splitmix64(seed ^ splitmix64(fnv1a64(name)))          (two 32-bit words, low first)
//   counter = (g / 4 as two 32-bit words, low first, 0, 0)
//   u[0..3] = (Philox4x32-10(counter, key)[i] + 0.5) / 2^32          (in (0, 1))
//   z       = Box-Muller: (u0, u1) -> sqrt(-2 ln u0)·(cos, sin)(2π u1) for g % 4 = 0, 1, and
//             (u2, u3) the same way for g % 4 = 2, 3; computed in double
//   value   = std·z (ParamInit::normal: init_std; normal_residual: init_std / sqrt(2·layers)),
//             0 (zeros), 1 (ones)
//
// Rule a reader could get wrong: the index is always the global one. A tensor-parallel shard
// must map its local elements to global indices (param_global_index), never count from 0.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "trainer/model/model_spec.h"

namespace llmtrain::trainer {

// Philox4x32 with 10 rounds (Salmon et al., SC'11), as in Random123.
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// The key of a parameter's stream.
std::array<uint32_t, 2> param_rng_key(uint64_t seed, std::string_view name);

// out[i] = std·(normal number first + i of the stream with this key, as above), for a contiguous run
// of global indices (one Philox call per four elements).
void normal_fill(std::array<uint32_t, 2> key, uint64_t first, float* out, int64_t count, double std);

// The standard deviation of a normal-initialized parameter (init_std, or init_std / sqrt(2·layers)
// for projections into the residual stream).
double param_init_std(const ParamSpec& spec, const ModelConfig& model);

}  // namespace llmtrain::trainer
