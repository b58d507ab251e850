#include "trainer/model/param_init.h"

#include <cmath>
#include <numbers>

namespace llmtrain::trainer {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k[0] += kW0;
      k[1] += kW1;
    }
    const uint64_t p0 = uint64_t(kM0) * c[0], p1 = uint64_t(kM1) * c[2];
    c = {uint32_t(p1 >> 32) ^ c[1] ^ k[0], uint32_t(p1), uint32_t(p0 >> 32) ^ c[3] ^ k[1], uint32_t(p0)};
  }
  return c;
}

std::array<uint32_t, 2> param_rng_key(uint64_t seed, std::string_view name) {
  const uint64_t k = splitmix64(seed ^ splitmix64(fnv1a64(name)));
  return {uint32_t(k), uint32_t(k >> 32)};
}

namespace {
// Box-Muller on one Philox output: four standard normals.
std::array<double, 4> normals4(std::array<uint32_t, 2> key, uint64_t block) {
  const auto r = philox4x32_10({uint32_t(block), uint32_t(block >> 32), 0, 0}, key);
  std::array<double, 4> z;
  for (int pair = 0; pair < 2; ++pair) {
    const double u0 = (double(r[2 * pair]) + 0.5) * 0x1p-32, u1 = (double(r[2 * pair + 1]) + 0.5) * 0x1p-32;
    const double radius = std::sqrt(-2.0 * std::log(u0)), angle = 2.0 * std::numbers::pi * u1;
    z[2 * pair] = radius * std::cos(angle);
    z[2 * pair + 1] = radius * std::sin(angle);
  }
  return z;
}
}  // namespace

void normal_fill(std::array<uint32_t, 2> key, uint64_t first, float* out, int64_t count, double std) {
  uint64_t block = ~uint64_t(0);
  std::array<double, 4> z{};
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t g = first + uint64_t(i);
    if (g / 4 != block) {
      block = g / 4;
      z = normals4(key, block);
    }
    out[i] = float(std * z[g % 4]);
  }
}

double param_init_std(const ParamSpec& spec, const ModelConfig& model) {
  return spec.init == ParamInit::normal_residual ? model.init_std / std::sqrt(2.0 * model.layers) : model.init_std;
}

}  // namespace llmtrain::trainer
