// Token sampling: greedy, top-k, top-p and temperature give the distributions their definitions
// say (computed here directly from the formulas), and a fixed uniform gives a fixed token.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "trainer/model/sampling.h"

using namespace llmtrain;
using namespace llmtrain::trainer;

namespace {

std::vector<double> empirical(const std::vector<float>& logits, const SamplingParams& p, int draws = 200000) {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<double> freq(logits.size());
  for (int i = 0; i < draws; ++i) freq[sample_token(logits, p, u(rng))] += 1.0 / draws;
  return freq;
}

TEST(Sampling, GreedyPicksArgmaxLowestOnTies) {
  std::vector<float> l{0.5f, 2.0f, 2.0f, -1.0f};
  EXPECT_EQ(sample_token(l, {0.0, 0, 1.0}, 0.99), 1);
  EXPECT_EQ(sample_token(l, {1.0, 1, 1.0}, 0.99), 1);  // top_k 1 is greedy
}

TEST(Sampling, TemperatureOneIsSoftmax) {
  std::vector<float> l{1.0f, 2.0f, 0.0f, -1.0f};
  auto f = empirical(l, {1.0, 0, 1.0});
  double z = 0;
  for (float x : l) z += std::exp(x);
  for (size_t i = 0; i < l.size(); ++i) EXPECT_NEAR(f[i], std::exp(l[i]) / z, 0.005) << i;
}

TEST(Sampling, TemperatureSharpens) {
  std::vector<float> l{1.0f, 2.0f, 0.0f};
  auto f = empirical(l, {0.5, 0, 1.0});
  double z = std::exp(2.0) + std::exp(4.0) + std::exp(0.0);
  EXPECT_NEAR(f[1], std::exp(4.0) / z, 0.005);
}

TEST(Sampling, TopKRenormalizesOverTheKBest) {
  std::vector<float> l{1.0f, 3.0f, 2.0f, 0.0f};
  auto f = empirical(l, {1.0, 2, 1.0});
  double z = std::exp(3.0) + std::exp(2.0);
  EXPECT_NEAR(f[1], std::exp(3.0) / z, 0.005);
  EXPECT_NEAR(f[2], std::exp(2.0) / z, 0.005);
  EXPECT_EQ(f[0], 0.0);
  EXPECT_EQ(f[3], 0.0);
}

TEST(Sampling, TopPKeepsTheSmallestNucleus) {
  // Probabilities 0.5, 0.3, 0.2: top_p 0.7 keeps the first two (0.5 < 0.7 <= 0.8).
  std::vector<float> l{std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  auto f = empirical(l, {1.0, 0, 0.7});
  EXPECT_NEAR(f[0], 0.5 / 0.8, 0.005);
  EXPECT_NEAR(f[1], 0.3 / 0.8, 0.005);
  EXPECT_EQ(f[2], 0.0);
}

// The uniform number walks the cumulative distribution of the candidates in decreasing order of
// probability, so a fixed uniform gives a fixed, predictable token (what makes --seed reproducible).
TEST(Sampling, UniformWalksTheCumulativeDistribution) {
  std::vector<float> l{0.1f, 0.4f, 0.3f, 0.2f};  // order by probability: 1, 2, 3, 0
  double z = 0;
  for (float x : l) z += std::exp(x);
  const double p1 = std::exp(0.4) / z, p2 = std::exp(0.3) / z;
  EXPECT_EQ(sample_token(l, {1.0, 0, 1.0}, 0.0), 1);
  EXPECT_EQ(sample_token(l, {1.0, 0, 1.0}, p1 - 1e-6), 1);
  EXPECT_EQ(sample_token(l, {1.0, 0, 1.0}, p1 + 1e-6), 2);
  EXPECT_EQ(sample_token(l, {1.0, 0, 1.0}, p1 + p2 + 1e-6), 3);
  EXPECT_EQ(sample_token(l, {1.0, 0, 1.0}, 0.999999), 0);
  // A masked id (logit −∞, probability 0) is never drawn, not even by a uniform within rounding of 1.
  const float masked = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(sample_token(std::vector<float>{0.1f, masked, 0.3f, masked}, {1.0, 0, 1.0}, 1.0), 0);
  EXPECT_EQ(sample_token(std::vector<float>{masked, 2.0f, masked}, {1.0, 0, 1.0}, 1.0), 1);
  EXPECT_EQ(sample_token(std::vector<float>{masked, 2.0f, masked}, {0.0, 0, 1.0}, 0.5), 1);
}

}  // namespace
