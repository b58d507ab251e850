// Softmax cross-entropy over padded logits (kernels/cpu/cross_entropy.cpp): padding columns
// excluded, ignored rows, in-place backward, NaN propagation.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernels/ops.h"
#include "op_harness.h"

namespace llmtrain::kernels::test {

namespace {
constexpr int32_t kIgnore = -100;
}

TEST(CrossEntropy, ForwardBackwardMatchReference) {
  std::mt19937_64 rng(91);
  for (int trial = 0; trial < 5; ++trial) {
    const int64_t n = rand_dim(rng, 1, 30), vocab = rand_dim(rng, 2, 1500), vpad = vocab + rand_dim(rng, 0, 40);
    const bool in_place = trial % 2 == 1;
    OpCase oc{.name = "cross_entropy n=" + std::to_string(n) + " vocab=" + std::to_string(vocab) +
                      " padded=" + std::to_string(vpad) + (in_place ? " in place" : ""),
              .args = {{"logits", {n, vpad}, Role::input, 0, 0, 3.0},
                       {"targets", {n}, Role::index, 0, int32_t(vocab)},
                       {"losses", {n}, Role::output, 0, 0, 1.0, /*uniform_dout=*/true},
                       {"lse", {n}, Role::saved}}};
    oc.setup = [=](OpRun& r) {
      if (n > 2) r.i["targets"][1] = kIgnore;  // one ignored row
    };
    oc.forward = [=](OpRun& r) {
      cross_entropy_forward(r.t("losses"), r.t("lse"), r.t("logits"), r.t("targets"), vocab, kIgnore);
    };
    oc.backward = [=](OpRun& r) {
      const float dloss = r.g["losses"][0];
      if (in_place) {
        std::vector<float> keep = r.f["logits"];
        cross_entropy_backward(r.t("logits"), r.t("logits"), r.t("lse"), r.t("targets"), vocab, kIgnore, dloss);
        r.g["logits"] = r.f["logits"];
        r.f["logits"] = keep;
      } else {
        cross_entropy_backward(r.grad("logits"), r.t("logits"), r.t("lse"), r.t("targets"), vocab, kIgnore, dloss);
      }
    };
    oc.reference = [=](RefRun& r) {
      const auto& x = r.in("logits");
      for (int64_t i = 0; i < n; ++i) {
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j < vocab; ++j) mx = std::max(mx, x[i * vpad + j]);
        for (int64_t j = 0; j < vocab; ++j) sum += std::exp(x[i * vpad + j] - mx);
        const double lse = mx + std::log(sum);
        r.out("lse")[i] = lse;
        const int32_t t = r.ints("targets")[i];
        r.out("losses")[i] = t == kIgnore ? 0.0 : lse - x[i * vpad + t];
      }
    };
    run_case(oc, 1100 + trial);
  }
}

TEST(CrossEntropy, NonFiniteLogitGivesNanLoss) {
  std::vector<float> logits = {0.5f, std::numeric_limits<float>::quiet_NaN(), 1.0f, 2.0f, 0.0f, 1.0f};
  std::vector<int32_t> targets = {0, 2};
  std::vector<float> losses(2), lse(2);
  cross_entropy_forward(host_tensor(losses.data(), {2}), host_tensor(lse.data(), {2}),
                        host_tensor(logits.data(), {2, 3}), host_tensor(targets.data(), {2}), 3, kIgnore);
  EXPECT_TRUE(std::isnan(losses[0]));
  EXPECT_NEAR(losses[1], std::log(std::exp(2.0) + 1.0 + std::exp(1.0)) - 1.0, 1e-6);
}

}  // namespace llmtrain::kernels::test
