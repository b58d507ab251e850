// GELU, tanh approximation (kernels/cpu/gelu.cpp), through the op harness; inputs span the
// saturated tails as well as the centre.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/ops.h"
#include "op_harness.h"

namespace llmtrain::kernels::test {

TEST(Gelu, ForwardBackwardMatchReference) {
  std::mt19937_64 rng(51);
  for (int trial = 0; trial < 4; ++trial) {
    const int64_t n = rand_dim(rng, 1, 3000);
    OpCase oc{.name = "gelu n=" + std::to_string(n),
              .args = {{"x", {n}, Role::input, 0, 0, trial < 2 ? 1.0 : 6.0}, {"y", {n}, Role::output}}};
    oc.forward = [](OpRun& r) { gelu_forward(r.t("y"), r.t("x")); };
    oc.backward = [](OpRun& r) { gelu_backward(r.grad("x"), r.grad("y"), r.t("x")); };
    oc.reference = [=](RefRun& r) {
      for (int64_t i = 0; i < n; ++i) {
        const double x = r.in("x")[i];
        r.out("y")[i] = 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
      }
    };
    oc.bf16 = {5e-3, 1.6e-2};
    oc.fp16 = {6e-4, 4e-3};
    oc.cuda = true;  // the device's expf, not the CPU's polynomial
    oc.cuda_bf16 = 2e-3;
    oc.cuda_fp16 = 5e-4;
    run_case(oc, 600 + trial);
  }
}

TEST(Gelu, BackwardInPlace) {
  // din may alias dout.
  std::vector<float> x = {-3.0f, -0.5f, 0.0f, 0.7f, 2.5f}, d = {1, 1, 1, 1, 1}, ref(5), in_place = d;
  gelu_backward(host_tensor(ref.data(), {5}), host_tensor(d.data(), {5}), host_tensor(x.data(), {5}));
  gelu_backward(host_tensor(in_place.data(), {5}), host_tensor(in_place.data(), {5}), host_tensor(x.data(), {5}));
  EXPECT_EQ(ref, in_place);
}

// 16-bit storage (kernels/dispatch.cpp widens operands): an in-place call (din aliasing dout)
// shares one widened copy and gives the out-of-place call's bits; mixing a 16-bit storage operand
// with an fp32 one, or bf16 with fp16, is a broken invariant.
TEST(Gelu, SixteenBitInPlaceAndMixedDtypes) {
  std::vector<float> x = {-3.0f, -0.5f, 0.0f, 0.7f, 2.5f}, d = {1, -2, 3, 0.5f, 1};
  std::vector<uint16_t> xh(5), dh(5), ref(5), in_place(5);
  convert(Tensor(xh.data(), DType::bf16, {5}), host_tensor(x.data(), {5}));
  convert(Tensor(dh.data(), DType::bf16, {5}), host_tensor(d.data(), {5}));
  in_place = dh;
  gelu_backward(Tensor(ref.data(), DType::bf16, {5}), Tensor(dh.data(), DType::bf16, {5}),
                Tensor(xh.data(), DType::bf16, {5}));
  gelu_backward(Tensor(in_place.data(), DType::bf16, {5}), Tensor(in_place.data(), DType::bf16, {5}),
                Tensor(xh.data(), DType::bf16, {5}));
  EXPECT_EQ(ref, in_place);
  EXPECT_DEATH(gelu_forward(host_tensor(d.data(), {5}), Tensor(xh.data(), DType::bf16, {5})),
               "bf16 and fp32 storage operands");
  EXPECT_DEATH(gelu_forward(Tensor(dh.data(), DType::fp16, {5}), Tensor(xh.data(), DType::bf16, {5})),
               "fp16 and bf16 operands|bf16 and fp16 operands");
}

}  // namespace llmtrain::kernels::test
