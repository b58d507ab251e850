// Linear (kernels/cpu/linear.cpp) through the op harness: with and without bias, odd sizes; and the
// MLP's fused pair (linear_gelu_forward, linear_backward_input_gelu), whose CUDA forms are
// cuBLASLt's GELU epilogues when the GELU's width is a multiple of 8 (the unfused kernels otherwise).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "op_harness.h"

namespace llmtrain::kernels::test {

TEST(Linear, ForwardBackwardMatchReference) {
  std::mt19937_64 rng(41);
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t n = rand_dim(rng, 1, 37), in = rand_dim(rng, 1, 70), out = rand_dim(rng, 1, 70);
    const bool bias = trial % 2 == 0;
    OpCase oc{.name = "linear n=" + std::to_string(n) + " in=" + std::to_string(in) + " out=" + std::to_string(out) +
                      (bias ? " +bias" : ""),
              .args = {{"x", {n, in}, Role::input},
                       {"w", {out, in}, Role::param},
                       {"b", {bias ? out : 1}, bias ? Role::param : Role::constant},
                       {"y", {n, out}, Role::output}}};
    oc.forward = [=](OpRun& r) { linear_forward(r.t("y"), r.t("x"), r.t("w"), bias ? r.t("b") : Tensor{}); };
    oc.backward = [=](OpRun& r) {
      linear_backward(r.grad("x"), r.grad("w"), bias ? r.grad("b") : Tensor{}, r.grad("y"), r.t("x"), r.t("w"));
    };
    oc.reference = [=](RefRun& r) {
      const auto &x = r.in("x"), &w = r.in("w"), &b = r.in("b");
      for (int64_t i = 0; i < n; ++i)
        for (int64_t o = 0; o < out; ++o) {
          double s = bias ? b[o] : 0.0;
          for (int64_t k = 0; k < in; ++k) s += x[i * in + k] * w[o * in + k];
          r.out("y")[i * out + o] = s;
        }
    };
    oc.bf16 = {5e-3, 2e-2};
    oc.fp16 = {8e-4, 3e-3};
    oc.cuda = true;  // cuBLASLt (or its simulator model): fp32 sums in k order, where BLAS blocks them
    // On a GPU, cuBLASLt's bf16 bias epilogue rounds the product to bf16 before adding the bias:
    // up to one more unit in the last place (2^-8) per element (measured 2.9e-3 on an H100). The
    // bias gradient is BGRADB's sums rounded to 16 bits, then added to the gradient: one rounding
    // more than the CPU's (measured on the simulator: b 2.9e-3 bf16, 4.6e-4 fp16).
    oc.cuda_bf16 = 9e-3;
    oc.cuda_fp16 = 1.4e-3;
    run_case(oc, 500 + trial);
  }
}

// GPT-2's MLP as the model runs it: fc = x·w1ᵀ (+ b1), act = GELU(fc) in one op, y = act·w2ᵀ; its
// backward takes d(fc) through the GELU from the second linear's input-gradient product, with b1's
// gradient (accumulated), then the two weight gradients and d(x). dfc is scratch (a constant the
// backward overwrites). Widths h a multiple of 8 take the epilogues on CUDA; odd h the fallback.
TEST(Linear, MlpGeluPairMatchesReference) {
  std::mt19937_64 rng(45);
  for (int trial = 0; trial < 4; ++trial) {
    const int64_t n = rand_dim(rng, 1, 29), in = rand_dim(rng, 1, 37), out = rand_dim(rng, 1, 37);
    const int64_t h = trial < 3 ? 8 * rand_dim(rng, 1, 6) : 2 * rand_dim(rng, 1, 20) + 1;
    const bool bias = trial != 1;
    OpCase oc{.name = "linear+gelu n=" + std::to_string(n) + " in=" + std::to_string(in) + " h=" + std::to_string(h) +
                      " out=" + std::to_string(out) + (bias ? " +bias" : ""),
              .args = {{"x", {n, in}, Role::input},
                       {"w1", {h, in}, Role::param, 0, 0, 0.5},
                       {"b1", {bias ? h : 1}, bias ? Role::param : Role::constant},
                       {"w2", {out, h}, Role::param, 0, 0, 0.5},
                       {"dfc", {n, h}, Role::constant},
                       {"fc", {n, h}, Role::saved},
                       {"act", {n, h}, Role::saved},
                       {"y", {n, out}, Role::output}}};
    oc.forward = [=](OpRun& r) {
      linear_gelu_forward(r.t("act"), r.t("fc"), r.t("x"), r.t("w1"), bias ? r.t("b1") : Tensor{});
      linear_forward(r.t("y"), r.t("act"), r.t("w2"), Tensor{});
    };
    oc.backward = [=](OpRun& r) {
      linear_backward_input_gelu(r.t("dfc"), bias ? r.grad("b1") : Tensor{}, r.grad("y"), r.t("w2"), r.t("fc"));
      linear_backward(Tensor{}, r.grad("w2"), Tensor{}, r.grad("y"), r.t("act"), r.t("w2"));
      linear_backward(r.grad("x"), r.grad("w1"), Tensor{}, r.t("dfc"), r.t("x"), r.t("w1"));
    };
    oc.reference = [=](RefRun& r) {
      const auto &x = r.in("x"), &w1 = r.in("w1"), &b1 = r.in("b1"), &w2 = r.in("w2");
      auto &fc = r.out("fc"), &act = r.out("act"), &y = r.out("y");
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < h; ++j) {
          double s = bias ? b1[j] : 0.0;
          for (int64_t k = 0; k < in; ++k) s += x[i * in + k] * w1[j * in + k];
          fc[i * h + j] = s;
          act[i * h + j] = 0.5 * s * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (s + 0.044715 * s * s * s)));
        }
      for (int64_t i = 0; i < n; ++i)
        for (int64_t o = 0; o < out; ++o) {
          double s = 0;
          for (int64_t j = 0; j < h; ++j) s += act[i * h + j] * w2[o * h + j];
          y[i * out + o] = s;
        }
    };
    // Measured (LLMTRAIN_OP_VERBOSE=1): forward 2.5e-3 bf16, 3.7e-4 fp16; gradients 2.9e-2 bf16 (w2's
    // direction), 5.4e-3 fp16; on the simulated device against the CPU 4.0e-3 bf16, 5.1e-4 fp16 (the
    // GELU and its gradient on the unrounded sums, the bias gradient rounded twice), 4.4e-7 fp32.
    oc.bf16 = {8e-3, 9e-2};
    oc.fp16 = {1.2e-3, 1.6e-2};
    oc.cuda = true;
    oc.cuda_bf16 = 1.2e-2;
    oc.cuda_fp16 = 1.5e-3;
    run_case(oc, 700 + trial);
  }
}

// On the CPU the fused pair is the unfused ops bitwise, with 16-bit storage too (the intermediate
// rounded as the first op stores it): linear_forward + gelu_forward, and linear_backward_input +
// gelu_backward + residual_backward (the bias gradient accumulating into its start).
TEST(Linear, MlpGeluPairIsTheUnfusedOpsOnTheCpu) {
  std::mt19937_64 rng(46);
  const int64_t n = 7, in = 13, h = 24, out = 9;
  for (const DType dtype : {DType::fp32, DType::bf16, DType::fp16}) {
    SCOPED_TRACE(to_string(dtype));
    const size_t bytes = dtype_size(dtype);
    auto make = [&](int64_t count) {
      std::vector<float> v(static_cast<size_t>(count));
      std::normal_distribution<float> u(0.0f, 1.0f);
      for (float& x : v) x = u(rng);
      std::vector<uint8_t> b(size_t(count) * bytes);
      convert(Tensor(b.data(), dtype, {count}), host_tensor(v.data(), {count}));
      return b;
    };
    auto t = [&](std::vector<uint8_t>& v, Shape shape) { return Tensor(v.data(), dtype, shape); };
    std::vector<uint8_t> x = make(n * in), w1 = make(h * in), b1 = make(h), w2 = make(out * h), dy = make(n * out);
    std::vector<uint8_t> db_fused = make(h), db_ops = db_fused;
    std::vector<uint8_t> fc_fused(size_t(n * h) * bytes), act_fused(fc_fused.size()), fc_ops(fc_fused.size()),
        act_ops(fc_fused.size()), dfc_fused(fc_fused.size()), dfc_ops(fc_fused.size());
    linear_gelu_forward(t(act_fused, {n, h}), t(fc_fused, {n, h}), t(x, {n, in}), t(w1, {h, in}), t(b1, {h}));
    linear_forward(t(fc_ops, {n, h}), t(x, {n, in}), t(w1, {h, in}), t(b1, {h}));
    gelu_forward(t(act_ops, {n, h}), t(fc_ops, {n, h}));
    EXPECT_EQ(fc_fused, fc_ops);
    EXPECT_EQ(act_fused, act_ops);
    linear_backward_input_gelu(t(dfc_fused, {n, h}), t(db_fused, {h}), t(dy, {n, out}), t(w2, {out, h}),
                               t(fc_ops, {n, h}));
    linear_backward_input(t(dfc_ops, {n, h}), t(dy, {n, out}), t(w2, {out, h}));
    gelu_backward(t(dfc_ops, {n, h}), t(dfc_ops, {n, h}), t(fc_ops, {n, h}));
    residual_backward(t(db_ops, {h}), t(dfc_ops, {n, h}));
    EXPECT_EQ(dfc_fused, dfc_ops);
    EXPECT_EQ(db_fused, db_ops);
  }
}

TEST(Linear, BackwardWithoutInputGradient) {
  // The first layer's input needs no gradient: din absent, dweight still accumulates.
  OpCase oc{.name = "linear without din",
            .args = {{"x", {5, 7}, Role::constant}, {"w", {3, 7}, Role::param}, {"y", {5, 3}, Role::output}}};
  oc.forward = [](OpRun& r) { linear_forward(r.t("y"), r.t("x"), r.t("w"), Tensor{}); };
  oc.backward = [](OpRun& r) { linear_backward(Tensor{}, r.grad("w"), Tensor{}, r.grad("y"), r.t("x"), r.t("w")); };
  oc.reference = [](RefRun& r) {
    for (int i = 0; i < 5; ++i)
      for (int o = 0; o < 3; ++o) {
        double s = 0;
        for (int k = 0; k < 7; ++k) s += r.in("x")[i * 7 + k] * r.in("w")[o * 7 + k];
        r.out("y")[i * 3 + o] = s;
      }
  };
  oc.bf16 = {5e-3, 2e-2};
  oc.fp16 = {8e-4, 3e-3};
  oc.cuda = true;
  oc.cuda_bf16 = 2e-3;
  oc.cuda_fp16 = 5e-4;
  run_case(oc, 599);
}

// A split backward (zero-bubble pipelines): linear_backward_input's din is bitwise linear_backward's,
// and linear_backward without din then accumulates the same dweight.
TEST(Linear, SplitBackwardIsTheWholeBackward) {
  std::mt19937_64 rng(43);
  const int64_t n = 13, in = 29, out = 17;
  auto fill = [&](std::vector<float>& v, size_t size) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    v.resize(size);
    for (float& x : v) x = u(rng);
  };
  std::vector<float> x, w, dy, dw_whole, dw_split, dx_whole(size_t(n * in)), dx_split(size_t(n * in));
  fill(x, size_t(n * in)), fill(w, size_t(out * in)), fill(dy, size_t(n * out)), fill(dw_whole, size_t(out * in));
  dw_split = dw_whole;
  linear_backward(host_tensor(dx_whole.data(), {n, in}), host_tensor(dw_whole.data(), {out, in}), Tensor{},
                  host_tensor(dy.data(), {n, out}), host_tensor(x.data(), {n, in}), host_tensor(w.data(), {out, in}));
  linear_backward_input(host_tensor(dx_split.data(), {n, in}), host_tensor(dy.data(), {n, out}),
                        host_tensor(w.data(), {out, in}));
  linear_backward(Tensor{}, host_tensor(dw_split.data(), {out, in}), Tensor{}, host_tensor(dy.data(), {n, out}),
                  host_tensor(x.data(), {n, in}), host_tensor(w.data(), {out, in}));
  EXPECT_EQ(dx_split, dx_whole);
  EXPECT_EQ(dw_split, dw_whole);
}

// The same with 16-bit storage (zero-bubble pipelines in bf16/fp16): din widened, computed in fp32
// and rounded once, bitwise linear_backward's din.
TEST(Linear, SplitBackwardIsTheWholeBackwardIn16Bits) {
  std::mt19937_64 rng(44);
  const int64_t n = 11, in = 23, out = 19;
  for (const DType dtype : {DType::bf16, DType::fp16}) {
    SCOPED_TRACE(to_string(dtype));
    auto make = [&](int64_t rows, int64_t cols) {
      std::vector<float> v(size_t(rows * cols));
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      for (float& x : v) x = u(rng);
      std::vector<uint16_t> h(v.size());
      convert(Tensor(h.data(), dtype, {rows, cols}), host_tensor(v.data(), {rows, cols}));
      return h;
    };
    std::vector<uint16_t> x = make(n, in), w = make(out, in), dy = make(n, out), dw = make(out, in);
    std::vector<uint16_t> dx_whole(size_t(n * in)), dx_split(size_t(n * in));
    auto t = [&](std::vector<uint16_t>& v, int64_t rows, int64_t cols) {
      return Tensor(v.data(), dtype, {rows, cols});
    };
    linear_backward(t(dx_whole, n, in), t(dw, out, in), Tensor{}, t(dy, n, out), t(x, n, in), t(w, out, in));
    linear_backward_input(t(dx_split, n, in), t(dy, n, out), t(w, out, in));
    EXPECT_EQ(dx_split, dx_whole);
  }
}

}  // namespace llmtrain::kernels::test
