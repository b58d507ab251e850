// Per-head RMSNorm (kernels/cpu/rmsnorm.cpp's head_rmsnorm_*, Qwen3's q_norm / k_norm) through
// the op harness: a range of heads of a packed [..., W, D] tensor normalized with one weight [D],
// the other heads of out and din left as they were, and the model's in-place backward (din ==
// dout) on a packed gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "op_harness.h"

namespace llmtrain::kernels::test {

namespace {

// One case over a [rows, W, D] tensor (shape gives the leading dims), heads [first, first + count).
// Separate (in_place false): out starts as the input `base`, whose other heads must come through
// untouched, and din's other heads must stay as they were (0 here: x reaches nothing else).
// In place: out starts as a copy of x (the packed row with its other heads passed on as they are),
// and the backward runs on the packed gradient in place, which keeps the other heads' gradient.
void run_head_rmsnorm_case(std::vector<int64_t> shape, int64_t first, int64_t count, bool in_place, uint64_t seed) {
  const int64_t rank = int64_t(shape.size()), width = shape[size_t(rank - 2)], d = shape[size_t(rank - 1)];
  const int64_t rows = numel(shape) / (width * d), n = numel(shape);
  const float eps = 1e-6f;
  std::string dims;
  for (int64_t s : shape) dims += (dims.empty() ? "" : "x") + std::to_string(s);
  OpCase oc{.name = "head_rmsnorm " + dims + " heads [" + std::to_string(first) + ", " + std::to_string(first + count) +
                    ")" + (in_place ? " in place" : ""),
            .args = {{"x", shape, Role::input},
                     {"base", shape, in_place ? Role::constant : Role::input},
                     {"w", {d}, Role::param},
                     {"y", shape, Role::output},
                     {"rstd", {rows * count}, Role::saved}}};
  auto in_range = [=](int64_t k) {
    const int64_t j = k / d % width;
    return j >= first && j < first + count;
  };
  oc.forward = [=](OpRun& r) {
    r.f["y"] = r.f[in_place ? "x" : "base"];
    head_rmsnorm_forward(r.t("y"), r.t("rstd"), r.t("x"), r.t("w"), first, count, eps);
  };
  oc.backward = [=](OpRun& r) {
    if (in_place) {
      // The model's call: head_rmsnorm_backward(dqkv, dw, dqkv, ...).
      r.g["x"] = r.g["y"];
      head_rmsnorm_backward(r.grad("x"), r.grad("w"), r.grad("x"), r.t("x"), r.t("w"), r.t("rstd"), first, count);
      return;
    }
    // base reaches y's other heads as they are; x only the normalized ones, whose gradient the op
    // must overwrite (NaN before) and leave the rest of din alone (0 before).
    r.g["base"] = r.g["y"];
    r.g["x"].assign(size_t(n), 0.0f);
    for (int64_t k = 0; k < n; ++k) {
      if (in_range(k)) {
        r.g["base"][size_t(k)] = 0.0f;
        r.g["x"][size_t(k)] = std::numeric_limits<float>::quiet_NaN();
      }
    }
    head_rmsnorm_backward(r.grad("x"), r.grad("w"), r.grad("y"), r.t("x"), r.t("w"), r.t("rstd"), first, count);
  };
  oc.reference = [=](RefRun& r) {
    const auto &x = r.in("x"), &w = r.in("w");
    auto& y = r.out("y");
    y = in_place ? x : r.in("base");
    for (int64_t row = 0; row < rows; ++row)
      for (int64_t h = 0; h < count; ++h) {
        const int64_t at = (row * width + first + h) * d;
        double ss = 0;
        for (int64_t i = 0; i < d; ++i) ss += x[at + i] * x[at + i];
        const double rs = 1.0 / std::sqrt(ss / double(d) + eps);
        for (int64_t i = 0; i < d; ++i) y[at + i] = x[at + i] * rs * w[i];
        r.out("rstd")[row * count + h] = rs;
      }
  };
  // The weight gradient sums rows·count head vectors into each of D values, then rounds start +
  // sum once to 16 bits; the random direction's check sees that rounding most when its own
  // derivative nearly cancels (up to 2.7e-2 bf16, 2.2e-3 fp16 measured).
  oc.bf16 = {5e-3, 8e-2};
  oc.fp16 = {6e-4, 7e-3};
  oc.cuda = true;  // warp sums in another order than the CPU's
  oc.cuda_bf16 = 2e-3;
  oc.cuda_fp16 = 5e-4;
  oc.fp32_args = {"rstd"};
  run_case(oc, seed);
}

}  // namespace

TEST(HeadRmsNorm, NormalizesARangeOfHeadsAndLeavesTheOthers) {
  std::mt19937_64 rng(37);
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t width = rand_dim(rng, 1, 6), first = rand_dim(rng, 0, width - 1);
    const int64_t count = rand_dim(rng, 1, width - first), d = rand_dim(rng, 1, 140);
    std::vector<int64_t> shape = trial % 2 ? std::vector<int64_t>{rand_dim(rng, 1, 3), rand_dim(rng, 1, 9)}
                                           : std::vector<int64_t>{rand_dim(rng, 1, 12)};
    shape.push_back(width);
    shape.push_back(d);
    run_head_rmsnorm_case(shape, first, count, false, 500 + trial);
  }
}

// Qwen3's two calls on a packed [B, T, heads + 2·kv_heads, D] row: q_norm on the q heads, then
// k_norm on the k heads; the second is large enough for the CPU's threaded reduction.
TEST(HeadRmsNorm, QueryAndKeyHeadsOfAPackedRow) {
  const int64_t heads = 4, kv_heads = 2, width = heads + 2 * kv_heads;
  run_head_rmsnorm_case({2, 3, width, 128}, 0, heads, false, 520);
  run_head_rmsnorm_case({2, 40, width, 128}, heads, kv_heads, false, 521);
}

TEST(HeadRmsNorm, BackwardInPlaceOnThePackedGradient) {
  const int64_t heads = 4, kv_heads = 2, width = heads + 2 * kv_heads;
  run_head_rmsnorm_case({2, 5, width, 64}, 0, heads, true, 530);
  run_head_rmsnorm_case({1, 7, width, 40}, heads, kv_heads, true, 531);
  run_head_rmsnorm_case({3, 40, width, 128}, heads, kv_heads, true, 532);  // threaded
}

}  // namespace llmtrain::kernels::test
