// Linear (kernels/cpu/linear.cpp) through the op harness: with and without bias, odd sizes.
#include <gtest/gtest.h>

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
    oc.cuda = true;  // our tiled GEMM: fp32 sums in k order, where BLAS blocks them
    // On a GPU, cuBLASLt's bf16 bias epilogue rounds the product to bf16 before adding the bias:
    // up to one more unit in the last place (2^-8) per element (measured 2.9e-3 on an H100).
    oc.cuda_bf16 = 4e-3;
    oc.cuda_fp16 = 5e-4;
    run_case(oc, 500 + trial);
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
