// The gated activations over fused [gate | up] rows (kernels/cpu/swiglu.cpp): SwiGLU, Gemma's
// GeGLU and gpt-oss's clamped SwiGLU, through the op harness.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "kernels/ops.h"
#include "op_harness.h"

namespace llmtrain::kernels::test {
namespace {

using Forward = std::function<void(Tensor out, Tensor in)>;
using Backward = std::function<void(Tensor din, Tensor dout, Tensor in)>;

// Four random shapes of one gated activation against `value(gate, up)` in double, the last with
// din aliasing in (the activations are dead after backward); `setup` may move the inputs.
void gated_cases(const std::string& name, uint64_t seed, const Forward& forward, const Backward& backward,
                 const std::function<double(double, double)>& value, const std::function<void(OpRun&)>& setup = {}) {
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 4; ++trial) {
    const int64_t n = rand_dim(rng, 1, 20), f = rand_dim(rng, 1, 90);
    OpCase oc{.name = name + " n=" + std::to_string(n) + " f=" + std::to_string(f),
              .args = {{"x", {n, 2 * f}, Role::input, 0, 0, trial % 2 ? 4.0 : 1.0}, {"y", {n, f}, Role::output}}};
    oc.setup = setup;
    oc.forward = [=](OpRun& r) { forward(r.t("y"), r.t("x")); };
    oc.backward = [=](OpRun& r) {
      if (trial == 3) {
        std::vector<float> keep = r.f["x"];
        backward(r.t("x"), r.grad("y"), r.t("x"));
        r.sync();
        r.g["x"] = r.f["x"];
        r.f["x"] = keep;
      } else {
        backward(r.grad("x"), r.grad("y"), r.t("x"));
      }
    };
    oc.reference = [=](RefRun& r) {
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < f; ++j)
          r.out("y")[i * f + j] = value(r.in("x")[i * 2 * f + j], r.in("x")[i * 2 * f + f + j]);
    };
    oc.bf16 = {6e-3, 4e-2};
    oc.fp16 = {6e-4, 3e-3};
    oc.cuda = true;  // the device's expf, not the CPU's polynomial
    oc.cuda_bf16 = 2e-3;
    oc.cuda_fp16 = 5e-4;
    run_case(oc, seed * 10 + uint64_t(trial));
  }
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

TEST(SwiGlu, ForwardBackwardMatchReference) {
  gated_cases("swiglu", 61, swiglu_forward, swiglu_backward, [](double g, double u) { return g * sigmoid(g) * u; });
}

// Gemma's GeGLU: gelu_tanh(gate) · up (transformers' gelu_pytorch_tanh).
TEST(GeGlu, ForwardBackwardMatchReference) {
  gated_cases("geglu", 62, geglu_forward, geglu_backward, [](double g, double u) {
    return 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))) * u;
  });
}

// gpt-oss's clamped SwiGLU (alpha 1.702; limit 7, and 1.5, which binds on most entries): the clamps
// pass no gradient where they bind. Finite differences across a kink disagree with either
// one-sided derivative, so the values within 0.3 of ±limit move 0.3 further out, on their side.
TEST(SwiGluClamped, ForwardBackwardMatchReference) {
  const float alpha = 1.702f;
  for (const float limit : {7.0f, 1.5f})
    gated_cases(
        "swiglu_clamped limit=" + std::to_string(limit), limit > 2 ? 63 : 64,
        [=](Tensor out, Tensor in) { swiglu_clamped_forward(out, in, alpha, limit); },
        [=](Tensor din, Tensor dout, Tensor in) { swiglu_clamped_backward(din, dout, in, alpha, limit); },
        [=](double gate, double up) {
          const double g = std::min(gate, double(limit)), u = std::clamp(up, -double(limit), double(limit));
          return (u + 1.0) * g * sigmoid(double(alpha) * g);
        },
        [=](OpRun& r) {
          for (float& x : r.f["x"])
            if (std::abs(std::abs(x) - limit) < 0.3f)
              x = std::copysign(std::abs(x) < limit ? limit - 0.3f : limit + 0.3f, x);
        });
}

}  // namespace llmtrain::kernels::test
