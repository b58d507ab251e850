// AdamW and the clipping pieces (kernels/cpu/adamw.cpp, kernels/cpu/l2norm.cpp) against a double
// implementation of torch.optim.AdamW's update, over several steps.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/backend_info.h"
#include "kernels/buffer.h"
#include "kernels/ops.h"
#include "op_harness.h"

namespace llmtrain::kernels::test {

TEST(AdamW, StepsMatchDoubleReference) {
  std::mt19937_64 rng(1201);
  std::normal_distribution<float> normal;
  const int64_t n = 100003;  // odd, above the parallel threshold
  std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f), g(n);
  for (auto& x : p) x = normal(rng);
  std::vector<double> rp(p.begin(), p.end()), rm(n, 0.0), rv(n, 0.0);
  const double lr = 3e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, gs = 0.37;
  for (int64_t step = 1; step <= 5; ++step) {
    for (auto& x : g) x = normal(rng);
    AdamWStep s{.lr = float(lr),
                .beta1 = float(b1),
                .beta2 = float(b2),
                .eps = float(eps),
                .weight_decay = float(wd),
                .step = step,
                .grad_scale = float(gs)};
    adamw_update(host_tensor(p.data(), {n}), host_tensor(g.data(), {n}), host_tensor(m.data(), {n}),
                 host_tensor(v.data(), {n}), s);
    for (int64_t i = 0; i < n; ++i) {
      const double gi = double(g[i]) * gs;
      rp[i] *= 1 - lr * wd;
      rm[i] = b1 * rm[i] + (1 - b1) * gi;
      rv[i] = b2 * rv[i] + (1 - b2) * gi * gi;
      const double bc1 = 1 - std::pow(b1, double(step)), bc2 = 1 - std::pow(b2, double(step));
      rp[i] -= lr / bc1 * rm[i] / (std::sqrt(rv[i]) / std::sqrt(bc2) + eps);
    }
  }
  EXPECT_LE(rel_error(std::vector<double>(p.begin(), p.end()), rp), 1e-6);
  EXPECT_LE(rel_error(std::vector<double>(m.begin(), m.end()), rm), 1e-6);
  EXPECT_LE(rel_error(std::vector<double>(v.begin(), v.end()), rv), 1e-6);
}

// Σ x² of a host tensor, through the op's fp32 output.
double host_sum_squares(Tensor x) {
  float out = 0;
  sum_squares(host_tensor(&out, {1}), x);
  return out;
}

TEST(AdamW, SumSquaresAndScale) {
  std::mt19937_64 rng(1202);
  std::normal_distribution<float> normal;
  for (int64_t n : {int64_t(1), int64_t(17), int64_t(70001), int64_t(1) << 20}) {
    std::vector<float> x(n);
    for (auto& e : x) e = normal(rng);
    double ref = 0;
    for (float e : x) ref += double(e) * double(e);
    EXPECT_NEAR(host_sum_squares(host_tensor(x.data(), {n})), ref, 1e-6 * ref) << n;
    // Reproducible: the same data gives the same bits.
    EXPECT_EQ(host_sum_squares(host_tensor(x.data(), {n})), host_sum_squares(host_tensor(x.data(), {n})));
    std::vector<float> y = x;
    scale(host_tensor(y.data(), {n}), 0.25f);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], x[i] * 0.25f);
  }
}

// The CUDA kernels against the CPU's, from the same data: three AdamW steps with fp32, bf16 and
// fp16 gradients (params and moments ≤ 1e-5 per tensor), Σ x² and x *= s.
TEST(AdamW, OnTheCudaDeviceMatchesTheCpu) {
  const CudaInfo cuda = cuda_info();
  if (!cuda.built || cuda.devices.empty()) GTEST_SKIP() << "no CUDA device (build with -DLLMTRAIN_CUDA=SIM)";
  std::mt19937_64 rng(1203);
  std::normal_distribution<float> normal;
  const int64_t n = 20011;
  auto on_device = [](const std::vector<float>& h, DType dtype) {
    const int64_t size = int64_t(h.size());
    Buffer wide(DType::fp32, {size}), d(dtype, {size}, Device::cuda);
    copy(wide.tensor(), host_tensor(h.data(), {size}));
    Buffer narrow(dtype, {size});
    convert(narrow.tensor(), wide.tensor());
    copy(d.tensor(), narrow.tensor());
    return d;
  };
  auto to_host = [](const Buffer& d) {
    std::vector<float> h(size_t(d.tensor().numel()));
    Buffer narrow(d.dtype(), d.tensor().shape);
    copy(narrow.tensor(), d.tensor());
    convert(host_tensor(h.data(), {int64_t(h.size())}), narrow.tensor());
    return std::vector<double>(h.begin(), h.end());
  };
  for (const DType gdt : {DType::fp32, DType::bf16, DType::fp16}) {
    SCOPED_TRACE(to_string(gdt));
    std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f);
    for (auto& x : p) x = normal(rng);
    Buffer dp = on_device(p, DType::fp32), dm = on_device(m, DType::fp32), dv = on_device(v, DType::fp32);
    for (int64_t step = 1; step <= 3; ++step) {
      std::vector<float> g(n);
      for (auto& x : g) x = normal(rng);
      const AdamWStep s{.lr = 3e-3f, .weight_decay = 0.1f, .step = step, .grad_scale = 0.37f};
      Buffer dg = on_device(g, gdt);
      Buffer hg(gdt, {n});
      copy(hg.tensor(), dg.tensor());
      adamw_update(host_tensor(p.data(), {n}), hg.tensor(), host_tensor(m.data(), {n}), host_tensor(v.data(), {n}), s);
      adamw_update(dp.tensor(), dg.tensor(), dm.tensor(), dv.tensor(), s);
    }
    EXPECT_LE(rel_error(to_host(dp), std::vector<double>(p.begin(), p.end())), 1e-5);
    EXPECT_LE(rel_error(to_host(dm), std::vector<double>(m.begin(), m.end())), 1e-5);
    EXPECT_LE(rel_error(to_host(dv), std::vector<double>(v.begin(), v.end())), 1e-5);
    // Σ x² of the last parameters, and x *= s, in this storage dtype.
    Buffer dx = on_device(p, gdt), hx(gdt, {n});
    copy(hx.tensor(), dx.tensor());
    // The device's sum stays on the device until it is copied back.
    Buffer dsum(DType::fp32, {1}, dx.tensor().device);
    sum_squares(dsum.tensor(), dx.tensor());
    float got = 0;
    copy(host_tensor(&got, {1}), dsum.tensor());
    const double want = host_sum_squares(hx.tensor());
    EXPECT_NEAR(got, want, 1e-5 * want);  // the CPU sums a chunk in sequence, the device as a tree
    scale(dx.tensor(), 0.25f);
    scale(hx.tensor(), 0.25f);
    Buffer back(gdt, {n});
    copy(back.tensor(), dx.tensor());
    std::vector<float> a(n), b(n);
    convert(host_tensor(a.data(), {n}), back.tensor());
    convert(host_tensor(b.data(), {n}), hx.tensor());
    EXPECT_EQ(a, b);
  }
}

}  // namespace llmtrain::kernels::test
