// Rotary embeddings (kernels/cpu/rope.cpp): the table against double trigonometry (with the
// linear and Llama 3.1 frequency scalings, as Hugging Face transformers computes them), and the
// rotation of the q and k heads of a packed row (v untouched) through the op harness.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend_info.h"
#include "kernels/buffer.h"
#include "kernels/ops.h"
#include "op_harness.h"

namespace llmtrain::kernels::test {

TEST(Rope, RotatesQueryAndKeyHeadsInHuggingFaceConvention) {
  std::mt19937_64 rng(71);
  for (int trial = 0; trial < 4; ++trial) {
    const int64_t b = rand_dim(rng, 1, 3), t = rand_dim(rng, 1, 21), d = 2 * rand_dim(rng, 1, 12);
    const int64_t heads = rand_dim(rng, 1, 5), rot = rand_dim(rng, 0, heads), p = t + rand_dim(rng, 0, 9);
    const int64_t begin = rand_dim(rng, 0, p - t);
    const double theta = trial % 2 ? 10000.0 : 500000.0;
    OpCase oc{.name = "rope t=" + std::to_string(t) + " d=" + std::to_string(d) + " rotated " + std::to_string(rot) +
                      "/" + std::to_string(heads),
              .args = {{"x", {b, t, heads, d}, Role::input},
                       {"table", {p, 2, d / 2}, Role::constant},
                       {"y", {b, t, heads, d}, Role::output}}};
    oc.setup = [=](OpRun& r) { rope_table(r.t("table"), theta, RopeScaling{}); };
    oc.forward = [=](OpRun& r) {
      r.f["y"] = r.f["x"];
      rope_forward(r.t("y"), r.t("table"), rot, begin);
    };
    oc.backward = [=](OpRun& r) {
      r.g["x"] = r.g["y"];
      rope_backward(r.grad("x"), r.t("table"), rot, begin);
    };
    oc.reference = [=](RefRun& r) {
      const auto& x = r.in("x");
      auto& y = r.out("y");
      y = x;
      for (int64_t row = 0; row < b * t; ++row)
        for (int64_t h = 0; h < rot; ++h)
          for (int64_t i = 0; i < d / 2; ++i) {
            const double angle = double(begin + row % t) / std::pow(theta, double(2 * i) / double(d));
            const int64_t lo = (row * heads + h) * d + i, hi = lo + d / 2;
            y[lo] = x[lo] * std::cos(angle) - x[hi] * std::sin(angle);
            y[hi] = x[hi] * std::cos(angle) + x[lo] * std::sin(angle);
          }
    };
    oc.bf16 = {4e-3, 5e-3};
    oc.fp16 = {6e-4, 6e-4};
    oc.cuda = true;  // the same fp32 rotation; the table is built on the device too
    oc.cuda_bf16 = 2e-3;
    oc.cuda_fp16 = 5e-4;
    oc.fp32_args = {"table"};
    run_case(oc, 800 + trial);
  }
}

namespace {

// Hugging Face's inv_freq (transformers' ROPE_INIT_FUNCTIONS), written as it writes it: the
// default frequencies, then for llama3 the low-frequency ones divided by the factor and the
// medium ones blended between the two. `branches` counts which case each frequency took
// (0 high, 1 medium, 2 low) so that a test can check it met all three.
std::vector<double> hf_inv_freq(int64_t d, double theta, const RopeScaling& s, int* branches = nullptr) {
  std::vector<double> inv(size_t(d / 2));
  for (int64_t i = 0; i < d / 2; ++i) inv[size_t(i)] = 1.0 / std::pow(theta, double(2 * i) / double(d));
  if (s.type == RopeScaling::Type::linear)
    for (double& f : inv) f /= s.factor;
  if (s.type == RopeScaling::Type::yarn) {
    // find_correction_range, linear_ramp_factor and the blend of _compute_yarn_parameters.
    auto correction = [&](double rotations) {
      return double(d) * std::log(s.original_max_positions / (rotations * 2 * std::numbers::pi)) /
             (2 * std::log(theta));
    };
    double low = correction(s.beta_fast), high = correction(s.beta_slow);
    if (s.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0), high = std::min(high, double(d - 1));
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < d / 2; ++i) {
      const double extrapolation = 1 - std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
      double& f = inv[size_t(i)];
      if (branches) ++branches[extrapolation == 1 ? 0 : extrapolation == 0 ? 2 : 1];
      f = f / s.factor * (1 - extrapolation) + f * extrapolation;
    }
    return inv;
  }
  if (s.type != RopeScaling::Type::llama3) return inv;
  const double low_freq_wavelen = s.original_max_positions / s.low_freq_factor;
  const double high_freq_wavelen = s.original_max_positions / s.high_freq_factor;
  for (double& f : inv) {
    const double wavelen = 2 * std::numbers::pi / f;
    const double llama = wavelen > low_freq_wavelen ? f / s.factor : f;
    const double smooth =
        (s.original_max_positions / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    const double smoothed = (1 - smooth) * llama / s.factor + smooth * llama;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    if (branches) ++branches[wavelen < high_freq_wavelen ? 0 : medium ? 1 : 2];
    f = medium ? smoothed : llama;
  }
  return inv;
}

}  // namespace

// Every entry of the table against the reference, each to its own size: the sines of the lowest
// frequencies are tiny, and a norm over the table would not see them scaled wrongly.
TEST(Rope, TableScalesFrequenciesAsHuggingFace) {
  const RopeScaling llama3{.type = RopeScaling::Type::llama3,
                           .factor = 8,
                           .low_freq_factor = 1,
                           .high_freq_factor = 4,
                           .original_max_positions = 8192};
  const std::pair<std::string, RopeScaling> scalings[] = {
      {"none", RopeScaling{}},
      {"linear", RopeScaling{.type = RopeScaling::Type::linear, .factor = 4}},
      {"llama3", llama3},
      // yarn as gpt-oss sets it (truncate false, an attention factor), and as Qwen's long-context
      // configs do (the range rounded to whole pairs).
      {"yarn", RopeScaling{.type = RopeScaling::Type::yarn,
                           .factor = 32,
                           .original_max_positions = 4096,
                           .truncate = false,
                           .attention_factor = 1.3465735902799727}},
      {"yarn-truncated", RopeScaling{.type = RopeScaling::Type::yarn, .factor = 4, .original_max_positions = 8192}}};
  std::vector<Device> devices = {Device::cpu};
  const CudaInfo cuda = cuda_info();
  if (cuda.built && !cuda.devices.empty()) devices.push_back(Device::cuda);
  for (const int64_t d : {64, 128})
    for (const auto& [what, scaling] : scalings) {
      int branches[3] = {0, 0, 0};
      const double theta = 500000;
      const std::vector<double> inv = hf_inv_freq(d, theta, scaling, branches);
      if (scaling.type != RopeScaling::Type::none && scaling.type != RopeScaling::Type::linear) {
        for (int b : branches) EXPECT_GT(b, 0) << "d " << d << ": a " << what << " branch not exercised";
      }
      const double scale = scaling.type == RopeScaling::Type::yarn ? scaling.attention_factor : 1.0;
      const int64_t p = 300, half = d / 2;
      for (const Device device : devices) {
        SCOPED_TRACE(what + " d " + std::to_string(d) + " on " + to_string(device));
        Buffer table(DType::fp32, {p, 2, half}, device);
        rope_table(table.tensor(), theta, scaling);
        std::vector<float> got(size_t(p * d));
        copy(Tensor(got.data(), DType::fp32, {p, 2, half}), table.tensor());
        int bad = 0;
        for (int64_t pos = 0; pos < p; ++pos)
          for (int64_t i = 0; i < half; ++i) {
            const double angle = double(pos) * inv[size_t(i)];
            for (const auto& [at, want] :
                 {std::pair{pos * d + i, scale * std::cos(angle)}, {pos * d + half + i, scale * std::sin(angle)}}) {
              if (std::abs(double(got[size_t(at)]) - want) <= 1e-6 * std::abs(want) + 1e-9) continue;
              if (++bad <= 5)
                ADD_FAILURE() << "position " << pos << " pair " << i << (at < pos * d + half ? " cos " : " sin ")
                              << got[size_t(at)] << ", expected " << want;
            }
          }
        EXPECT_EQ(bad, 0) << "entries off the reference";
      }
    }
}

}  // namespace llmtrain::kernels::test
