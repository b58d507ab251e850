// RMSNorm (kernels/cpu/rmsnorm.cpp) through the op harness, including the residual join.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/ops.h"
#include "op_harness.h"

namespace llmtrain::kernels::test {

TEST(RmsNorm, ForwardBackwardMatchReference) {
  std::mt19937_64 rng(31);
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t n = rand_dim(rng, 1, 33), c = rand_dim(rng, 1, 300);
    const bool with_residual = trial % 2 == 1;
    const float eps = 1e-6f;
    OpCase oc{.name = "rmsnorm n=" + std::to_string(n) + " c=" + std::to_string(c),
              .args = {{"x", {n, c}, Role::input},
                       {"w", {c}, Role::param},
                       {"y", {n, c}, Role::output},
                       {"rstd", {n}, Role::saved},
                       {"x_through", {n, c}, with_residual ? Role::output : Role::saved}}};
    oc.forward = [=](OpRun& r) {
      rmsnorm_forward(r.t("y"), r.t("rstd"), r.t("x"), r.t("w"), eps);
      r.f["x_through"] = r.f["x"];
    };
    oc.backward = [=](OpRun& r) {
      if (with_residual) r.g["x"] = r.g["x_through"];
      rmsnorm_backward(r.grad("x"), r.grad("w"), r.grad("y"), r.t("x"), r.t("w"), r.t("rstd"),
                       with_residual ? r.grad("x") : Tensor{});
    };
    oc.reference = [=](RefRun& r) {
      const auto &x = r.in("x"), &w = r.in("w");
      for (int64_t i = 0; i < n; ++i) {
        double ss = 0;
        for (int64_t j = 0; j < c; ++j) ss += x[i * c + j] * x[i * c + j];
        const double rs = 1.0 / std::sqrt(ss / double(c) + eps);
        for (int64_t j = 0; j < c; ++j) {
          r.out("y")[i * c + j] = x[i * c + j] * rs * w[j];
          r.out("x_through")[i * c + j] = x[i * c + j];
        }
        r.out("rstd")[i] = rs;
      }
    };
    oc.bf16 = {5e-3, 2e-2};
    oc.fp16 = {6e-4, 2e-3};
    oc.cuda = true;  // warp sums in another order than the CPU's
    oc.cuda_bf16 = 2e-3;
    oc.cuda_fp16 = 5e-4;
    oc.fp32_args = {"rstd"};
    run_case(oc, 400 + trial);
  }
}

}  // namespace llmtrain::kernels::test
