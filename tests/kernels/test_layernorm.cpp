// LayerNorm (kernels/cpu/layernorm.cpp) through the op harness, including the residual join
// (din = dresidual + local gradient, in place).
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/ops.h"
#include "op_harness.h"

namespace llmtrain::kernels::test {

namespace {

void reference_layernorm(RefRun& r, int64_t n, int64_t c, double eps) {
  const auto &x = r.in("x"), &w = r.in("w"), &b = r.in("b");
  for (int64_t i = 0; i < n; ++i) {
    double m = 0, var = 0;
    for (int64_t j = 0; j < c; ++j) m += x[i * c + j];
    m /= double(c);
    for (int64_t j = 0; j < c; ++j) var += (x[i * c + j] - m) * (x[i * c + j] - m);
    var /= double(c);
    const double rs = 1.0 / std::sqrt(var + eps);
    for (int64_t j = 0; j < c; ++j) r.out("y")[i * c + j] = (x[i * c + j] - m) * rs * w[j] + b[j];
    r.out("mean")[i] = m;
    r.out("rstd")[i] = rs;
    // The residual stream passes x through: its gradient joins din.
    for (int64_t j = 0; j < c; ++j) r.out("x_through")[i * c + j] = x[i * c + j];
  }
}

}  // namespace

TEST(LayerNorm, ForwardBackwardMatchReference) {
  std::mt19937_64 rng(21);
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t n = rand_dim(rng, 1, 33), c = rand_dim(rng, 2, 300);
    const bool with_residual = trial % 2 == 1;
    const float eps = 1e-5f;
    OpCase oc{.name = "layernorm n=" + std::to_string(n) + " c=" + std::to_string(c) +
                      (with_residual ? " +dresidual in place" : ""),
              .args = {{"x", {n, c}, Role::input, 0, 0, 2.0},
                       {"w", {c}, Role::param},
                       {"b", {c}, Role::param},
                       {"y", {n, c}, Role::output},
                       {"mean", {n}, Role::saved},
                       {"rstd", {n}, Role::saved},
                       {"x_through", {n, c}, with_residual ? Role::output : Role::saved}}};
    oc.forward = [=](OpRun& r) {
      layernorm_forward(r.t("y"), r.t("mean"), r.t("rstd"), r.t("x"), r.t("w"), r.t("b"), eps);
      r.f["x_through"] = r.f["x"];
    };
    oc.backward = [=](OpRun& r) {
      if (with_residual) {
        r.g["x"] = r.g["x_through"];  // din aliases dresidual
        layernorm_backward(r.grad("x"), r.grad("w"), r.grad("b"), r.grad("y"), r.t("x"), r.t("w"), r.t("mean"),
                           r.t("rstd"), r.grad("x"));
      } else {
        layernorm_backward(r.grad("x"), r.grad("w"), r.grad("b"), r.grad("y"), r.t("x"), r.t("w"), r.t("mean"),
                           r.t("rstd"), Tensor{});
      }
    };
    oc.reference = [=](RefRun& r) { reference_layernorm(r, n, c, eps); };
    oc.bf16 = {5e-3, 7e-2};
    oc.fp16 = {6e-4, 3e-3};
    oc.cuda = true;  // warp sums in another order than the CPU's
    oc.cuda_bf16 = 2e-3;
    oc.cuda_fp16 = 5e-4;
    oc.fp32_args = {"mean", "rstd"};
    run_case(oc, 300 + trial);
  }
}

}  // namespace llmtrain::kernels::test
