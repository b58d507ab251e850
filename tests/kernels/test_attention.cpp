// Causal grouped-query attention (kernels/cpu/attention.cpp) through the op harness: sequence
// lengths below, at and across the kernel's 32-row query blocks, multi-head and GQA layouts.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "op_harness.h"

namespace llmtrain::kernels::test {

namespace {

void reference_attention(RefRun& r, int64_t b, int64_t t, int64_t h, int64_t kv, int64_t d) {
  const auto& x = r.in("qkv");
  auto &out = r.out("out"), &lse = r.out("lse");
  const int64_t row = (h + 2 * kv) * d;
  std::vector<double> s(static_cast<size_t>(t));
  for (int64_t n = 0; n < b; ++n)
    for (int64_t head = 0; head < h; ++head) {
      const int64_t g = head / (h / kv);
      for (int64_t i = 0; i < t; ++i) {
        const double* q = &x[size_t((n * t + i) * row + head * d)];
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          const double* k = &x[size_t((n * t + j) * row + (h + g) * d)];
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += q[c] * k[c];
          s[j] = dot / std::sqrt(double(d));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(s[j] - mx);
        lse[size_t((n * h + head) * t + i)] = mx + std::log(sum);
        for (int64_t c = 0; c < d; ++c) {
          double o = 0;
          for (int64_t j = 0; j <= i; ++j)
            o += std::exp(s[j] - mx) / sum * x[size_t((n * t + j) * row + (h + kv + g) * d + c)];
          out[size_t(((n * t + i) * h + head) * d + c)] = o;
        }
      }
    }
}

OpCase attention_case(int64_t b, int64_t t, int64_t h, int64_t kv, int64_t d) {
  OpCase oc{.name = "attention b=" + std::to_string(b) + " t=" + std::to_string(t) + " heads=" + std::to_string(h) +
                    " kv_heads=" + std::to_string(kv) + " d=" + std::to_string(d),
            .args = {{"qkv", {b, t, h + 2 * kv, d}, Role::input},
                     {"out", {b, t, h, d}, Role::output},
                     {"lse", {b, h, t}, Role::saved}}};
  oc.forward = [=](OpRun& r) { attention_forward(r.t("out"), r.t("lse"), r.t("qkv"), h, kv); };
  oc.backward = [=](OpRun& r) {
    attention_backward(r.grad("qkv"), r.grad("out"), r.t("qkv"), r.t("out"), r.t("lse"), h, kv);
  };
  oc.reference = [=](RefRun& r) { reference_attention(r, b, t, h, kv, d); };
  return oc;
}

// Every case runs with each form of the block products this CPU has (OpenBLAS, AVX2, AVX-512):
// head dims the vector forms do not divide fall back to OpenBLAS within the same run.
class Attention : public ::testing::TestWithParam<cpu::AttentionIsa> {
 protected:
  void SetUp() override {
    if (GetParam() == cpu::AttentionIsa::avx512 && !cpu::cpu_has_avx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
    cpu::set_attention_isa(GetParam());
  }
  void TearDown() override { cpu::set_attention_isa(cpu::AttentionIsa::automatic); }
};

}  // namespace

TEST_P(Attention, MultiHeadMatchesReference) {
  run_case(attention_case(2, 1, 2, 2, 4), 1000);   // one token
  run_case(attention_case(1, 13, 3, 3, 8), 1001);  // within one query block
  run_case(attention_case(2, 64, 2, 2, 5), 1002);  // exactly two blocks, odd head dim
}

TEST_P(Attention, AcrossQueryBlocks) {
  run_case(attention_case(1, 130, 2, 2, 16), 1003);
  run_case(attention_case(2, 77, 1, 1, 32), 1004);
  run_case(attention_case(1, 150, 2, 2, 64), 1007);  // GPT-2's head dim, keys not a multiple of 32
  run_case(attention_case(1, 67, 1, 1, 40), 1008);   // head dim 32 + 8: every chunk width
  run_case(attention_case(1, 45, 1, 1, 48), 1009);   // 48 = 3 AVX-512 vectors
}

TEST_P(Attention, GroupedQueryHeads) {
  run_case(attention_case(2, 70, 4, 2, 8), 1005);
  run_case(attention_case(1, 19, 6, 1, 6), 1006);  // multi-query
}

INSTANTIATE_TEST_SUITE_P(Forms, Attention,
                         ::testing::Values(cpu::AttentionIsa::blas, cpu::AttentionIsa::avx2, cpu::AttentionIsa::avx512),
                         [](const auto& info) {
                           switch (info.param) {
                             case cpu::AttentionIsa::blas:
                               return std::string("blas");
                             case cpu::AttentionIsa::avx2:
                               return std::string("avx2");
                             case cpu::AttentionIsa::avx512:
                               return std::string("avx512");
                             default:
                               return std::string("automatic");
                           }
                         });

}  // namespace llmtrain::kernels::test
