// SwiGLU and GeGLU over fused [gate | up] rows (kernels/cpu/swiglu.cpp) through the op harness.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kernels/ops.h"
#include "op_harness.h"

namespace llmtrain::kernels::test {

TEST(SwiGlu, ForwardBackwardMatchReference) {
  std::mt19937_64 rng(61);
  for (int trial = 0; trial < 4; ++trial) {
    const int64_t n = rand_dim(rng, 1, 20), f = rand_dim(rng, 1, 90);
    OpCase oc{.name = "swiglu n=" + std::to_string(n) + " f=" + std::to_string(f),
              .args = {{"x", {n, 2 * f}, Role::input, 0, 0, trial % 2 ? 4.0 : 1.0}, {"y", {n, f}, Role::output}}};
    oc.forward = [](OpRun& r) { swiglu_forward(r.t("y"), r.t("x")); };
    oc.backward = [=](OpRun& r) {
      if (trial == 3) {  // din aliasing in: the activations are dead after backward
        std::vector<float> keep = r.f["x"];
        swiglu_backward(r.t("x"), r.grad("y"), r.t("x"));
        r.sync();
        r.g["x"] = r.f["x"];
        r.f["x"] = keep;
      } else {
        swiglu_backward(r.grad("x"), r.grad("y"), r.t("x"));
      }
    };
    oc.reference = [=](RefRun& r) {
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < f; ++j) {
          const double g = r.in("x")[i * 2 * f + j], u = r.in("x")[i * 2 * f + f + j];
          r.out("y")[i * f + j] = g / (1.0 + std::exp(-g)) * u;
        }
    };
    oc.bf16 = {6e-3, 4e-2};
    oc.fp16 = {6e-4, 3e-3};
    oc.cuda = true;  // the device's expf, not the CPU's polynomial
    oc.cuda_bf16 = 2e-3;
    oc.cuda_fp16 = 5e-4;
    run_case(oc, 700 + trial);
  }
}

// Gemma's GeGLU: gelu_tanh(gate) · up, against the double formula (transformers' gelu_pytorch_tanh).
TEST(GeGlu, ForwardBackwardMatchReference) {
  std::mt19937_64 rng(62);
  for (int trial = 0; trial < 4; ++trial) {
    const int64_t n = rand_dim(rng, 1, 20), f = rand_dim(rng, 1, 90);
    OpCase oc{.name = "geglu n=" + std::to_string(n) + " f=" + std::to_string(f),
              .args = {{"x", {n, 2 * f}, Role::input, 0, 0, trial % 2 ? 4.0 : 1.0}, {"y", {n, f}, Role::output}}};
    oc.forward = [](OpRun& r) { geglu_forward(r.t("y"), r.t("x")); };
    oc.backward = [=](OpRun& r) {
      if (trial == 3) {  // din aliasing in
        std::vector<float> keep = r.f["x"];
        geglu_backward(r.t("x"), r.grad("y"), r.t("x"));
        r.sync();
        r.g["x"] = r.f["x"];
        r.f["x"] = keep;
      } else {
        geglu_backward(r.grad("x"), r.grad("y"), r.t("x"));
      }
    };
    oc.reference = [=](RefRun& r) {
      const double c = std::sqrt(2.0 / M_PI);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < f; ++j) {
          const double g = r.in("x")[i * 2 * f + j], u = r.in("x")[i * 2 * f + f + j];
          r.out("y")[i * f + j] = 0.5 * g * (1.0 + std::tanh(c * (g + 0.044715 * g * g * g))) * u;
        }
    };
    oc.bf16 = {6e-3, 4e-2};
    oc.fp16 = {6e-4, 3e-3};
    oc.cuda = true;
    oc.cuda_bf16 = 2e-3;
    oc.cuda_fp16 = 5e-4;
    run_case(oc, 720 + trial);
  }
}

// gpt-oss's clamped SwiGLU (alpha 1.702, limit 7; and a limit of 1.5 that binds on most entries),
// against the double formula: the clamps pass no gradient where they bind (finite differences
// agree away from the kinks, which random values miss).
TEST(SwiGluClamped, ForwardBackwardMatchReference) {
  std::mt19937_64 rng(63);
  for (int trial = 0; trial < 4; ++trial) {
    const int64_t n = rand_dim(rng, 1, 20), f = rand_dim(rng, 1, 90);
    const float alpha = 1.702f, limit = trial < 2 ? 7.0f : 1.5f;
    OpCase oc{
        .name = "swiglu_clamped n=" + std::to_string(n) + " f=" + std::to_string(f) + " limit=" + std::to_string(limit),
        .args = {{"x", {n, 2 * f}, Role::input, 0, 0, trial % 2 ? 4.0 : 1.0}, {"y", {n, f}, Role::output}}};
    // Finite differences across a clamp's kink disagree with any one-sided derivative: the values
    // within 0.3 of ±limit move 0.3 further out, on their side.
    oc.setup = [=](OpRun& r) {
      for (float& x : r.f["x"])
        if (std::abs(std::abs(x) - limit) < 0.3f)
          x = std::copysign(std::abs(x) < limit ? limit - 0.3f : limit + 0.3f, x);
    };
    oc.forward = [=](OpRun& r) { swiglu_clamped_forward(r.t("y"), r.t("x"), alpha, limit); };
    oc.backward = [=](OpRun& r) {
      if (trial == 3) {  // din aliasing in
        std::vector<float> keep = r.f["x"];
        swiglu_clamped_backward(r.t("x"), r.grad("y"), r.t("x"), alpha, limit);
        r.sync();
        r.g["x"] = r.f["x"];
        r.f["x"] = keep;
      } else {
        swiglu_clamped_backward(r.grad("x"), r.grad("y"), r.t("x"), alpha, limit);
      }
    };
    oc.reference = [=](RefRun& r) {
      const double lim = limit;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < f; ++j) {
          const double g = std::min(r.in("x")[i * 2 * f + j], lim);
          const double u = std::clamp(r.in("x")[i * 2 * f + f + j], -lim, lim);
          r.out("y")[i * f + j] = (u + 1.0) * g / (1.0 + std::exp(-double(alpha) * g));
        }
    };
    oc.bf16 = {6e-3, 4e-2};
    oc.fp16 = {6e-4, 3e-3};
    oc.cuda = true;
    oc.cuda_bf16 = 2e-3;
    oc.cuda_fp16 = 5e-4;
    run_case(oc, 740 + trial);
  }
}

}  // namespace llmtrain::kernels::test
