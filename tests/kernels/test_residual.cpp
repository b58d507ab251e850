// The residual add with an optional broadcast bias (kernels/cpu/residual.cpp).
#include <gtest/gtest.h>

#include "kernels/ops.h"
#include "op_harness.h"

namespace llmtrain::kernels::test {

TEST(Residual, ForwardBackwardMatchReference) {
  std::mt19937_64 rng(81);
  for (int trial = 0; trial < 4; ++trial) {
    const int64_t n = rand_dim(rng, 1, 300), c = rand_dim(rng, 1, 200);
    const bool bias = trial % 2 == 0;
    OpCase oc{.name = "residual n=" + std::to_string(n) + " c=" + std::to_string(c) + (bias ? " +bias" : ""),
              .args = {{"a", {n, c}, Role::input},
                       {"b", {n, c}, Role::input},
                       {"bias", {bias ? c : 1}, bias ? Role::param : Role::constant},
                       {"y", {n, c}, Role::output}}};
    oc.forward = [=](OpRun& r) {
      if (trial == 3) {  // out aliasing a
        r.f["y"] = r.f["a"];
        residual_forward(r.t("y"), r.t("y"), r.t("b"), Tensor{});
      } else {
        residual_forward(r.t("y"), r.t("a"), r.t("b"), bias ? r.t("bias") : Tensor{});
      }
    };
    oc.backward = [=](OpRun& r) {
      r.g["a"] = r.g["y"];
      r.g["b"] = r.g["y"];
      if (bias) residual_backward(r.grad("bias"), r.grad("y"));
    };
    oc.reference = [=](RefRun& r) {
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < c; ++j)
          r.out("y")[i * c + j] = r.in("a")[i * c + j] + r.in("b")[i * c + j] + (bias ? r.in("bias")[j] : 0.0);
    };
    oc.bf16 = {6e-3, 7e-3};
    oc.fp16 = {7e-4, 1e-3};
    oc.cuda = true;  // the same fp32 sums in the same order: equal to the CPU's up to the bias's column sums
    oc.cuda_bf16 = 1e-3;
    oc.cuda_fp16 = 1e-4;
    run_case(oc, 900 + trial);
  }
}

}  // namespace llmtrain::kernels::test
