// The counter-based RNG behind initialization: Philox4x32-10 against Random123's published
// known-answer vectors, the normal numbers' distribution, and the bulk path against the
// element-wise definition of trainer/model/param_init.h, written out here from that header.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "trainer/model/param_init.h"

namespace llmtrain::trainer {
namespace {

// Standard normal number `index` of the stream with this key, as param_init.h defines it: Philox
// of counter (index / 4, 0, 0), its words as uniforms (w + 0.5) / 2^32, Box-Muller on words 0, 1
// for index % 4 = 0, 1 and on words 2, 3 for 2, 3 (cos first).
double normal_at(std::array<uint32_t, 2> key, uint64_t index) {
  const uint64_t block = index / 4;
  const auto r = philox4x32_10({uint32_t(block), uint32_t(block >> 32), 0, 0}, key);
  const int pair = int(index % 4) / 2;
  const double u0 = (double(r[2 * pair]) + 0.5) * 0x1p-32, u1 = (double(r[2 * pair + 1]) + 0.5) * 0x1p-32;
  const double radius = std::sqrt(-2.0 * std::log(u0)), angle = 2.0 * std::numbers::pi * u1;
  return index % 2 == 0 ? radius * std::cos(angle) : radius * std::sin(angle);
}

}  // namespace

TEST(ParamInit, Philox4x32_10KnownAnswers) {
  // Random123's kat_vectors: counter, key -> output.
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (std::array<uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (std::array<uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (std::array<uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(ParamInit, NormalNumbersAreStandardNormal) {
  const auto key = param_rng_key(1234, "transformer.h.0.mlp.c_fc.weight");
  const int n = 200000;
  double sum = 0, sq = 0, within1 = 0;
  for (int i = 0; i < n; ++i) {
    const double z = normal_at(key, uint64_t(i));
    sum += z;
    sq += z * z;
    within1 += std::abs(z) < 1.0;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sq / n, 1.0, 0.01);
  EXPECT_NEAR(within1 / n, 0.6827, 0.005);  // P(|z| < 1)
}

TEST(ParamInit, StreamsDifferByNameAndSeed) {
  EXPECT_NE(param_rng_key(1, "a.weight"), param_rng_key(1, "b.weight"));
  EXPECT_NE(param_rng_key(1, "a.weight"), param_rng_key(2, "a.weight"));
  EXPECT_NE(normal_at(param_rng_key(1, "a.weight"), 0), normal_at(param_rng_key(1, "b.weight"), 0));
}

TEST(ParamInit, BulkFillEqualsTheElementwiseDefinitionFromAnyOffset) {
  const auto key = param_rng_key(42, "model.layers.3.self_attn.q_proj.weight");
  for (uint64_t first : {uint64_t(0), uint64_t(1), uint64_t(3), uint64_t(1) << 33}) {
    std::vector<float> out(37);
    normal_fill(key, first, out.data(), int64_t(out.size()), 0.02);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], float(0.02 * normal_at(key, first + i))) << first + i;
  }
}

}  // namespace llmtrain::trainer
