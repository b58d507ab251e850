// Rotary embeddings (kernels/cpu/rope.cpp): the table against double trigonometry, and the
// rotation of the q and k heads of a packed row (v untouched) through the op harness.
#include <gtest/gtest.h>

#include <cmath>

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
    oc.setup = [=](OpRun& r) { rope_table(r.t("table"), theta); };
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

}  // namespace llmtrain::kernels::test
