// Causal grouped-query attention (kernels/cpu/attention.cpp) through the op harness: sequence
// lengths below, at and across the kernel's 32-row query blocks, multi-head and GQA layouts; and
// its KV-cache form (kv_cache_write + attention_cached_forward) against a naive double reference
// and against the full-sequence kernel fed in chunks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

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

OpCase attention_case(cpu::AttentionIsa form, int64_t b, int64_t t, int64_t h, int64_t kv, int64_t d) {
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
  oc.bf16 = {5e-3, 2e-2};
  oc.fp16 = {6e-4, 4e-3};
  oc.fp32_args = {"lse"};
  // The flash-style CUDA kernels against the CPU (once, in the blas form's run: the CUDA side does
  // not depend on the CPU's form).
  oc.cuda = form == cpu::AttentionIsa::blas;
  oc.cuda_bf16 = 2e-3;
  oc.cuda_fp16 = 5e-4;
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

// Decoding: `past` positions already in the cache (random keys and values, a constant), then t
// new tokens at positions [past, past + t). The cache has `spare` unused rows after them, which
// must stay untouched (zero).
OpCase cached_case(cpu::AttentionIsa form, int64_t b, int64_t past, int64_t t, int64_t h, int64_t kv, int64_t d,
                   int64_t spare) {
  const int64_t t_max = past + t + spare;
  OpCase oc{.name = "attention_cached b=" + std::to_string(b) + " past=" + std::to_string(past) +
                    " t=" + std::to_string(t) + " heads=" + std::to_string(h) + " kv_heads=" + std::to_string(kv) +
                    " d=" + std::to_string(d),
            .args = {{"qkv", {b, t, h + 2 * kv, d}, Role::constant},
                     {"k_past", {b, past, kv, d}, Role::constant},
                     {"v_past", {b, past, kv, d}, Role::constant},
                     {"out", {b, t, h, d}, Role::output},
                     {"lse", {b, h, t}, Role::saved},
                     {"k_cache", {b, t_max, kv, d}, Role::saved},
                     {"v_cache", {b, t_max, kv, d}, Role::saved}}};
  oc.forward = [=](OpRun& r) {
    for (const char* c : {"k", "v"}) {
      const auto& src = r.f[std::string(c) + "_past"];
      auto& dst = r.f[std::string(c) + "_cache"];
      for (int64_t s = 0; s < b; ++s)
        std::copy_n(src.begin() + s * past * kv * d, past * kv * d, dst.begin() + s * t_max * kv * d);
    }
    kv_cache_write(r.t("k_cache"), r.t("v_cache"), r.t("qkv"), h, kv, past);
    attention_cached_forward(r.t("out"), r.t("lse"), r.t("qkv"), r.t("k_cache"), r.t("v_cache"), h, kv, past);
  };
  oc.reference = [=](RefRun& r) {
    const auto &x = r.in("qkv"), &kp = r.in("k_past"), &vp = r.in("v_past");
    const int64_t row = (h + 2 * kv) * d;
    // Key/value c of kv head g of sequence n at position j, from the past or from qkv.
    auto key = [&](int64_t n, int64_t j, int64_t g, int64_t c, bool value) {
      if (j < past) return (value ? vp : kp)[size_t(((n * past + j) * kv + g) * d + c)];
      return x[size_t((n * t + j - past) * row + (h + (value ? kv : 0) + g) * d + c)];
    };
    for (int64_t n = 0; n < b; ++n)
      for (int64_t j = 0; j < past + t; ++j)
        for (int64_t g = 0; g < kv; ++g)
          for (int64_t c = 0; c < d; ++c) {
            r.out("k_cache")[size_t(((n * t_max + j) * kv + g) * d + c)] = key(n, j, g, c, false);
            r.out("v_cache")[size_t(((n * t_max + j) * kv + g) * d + c)] = key(n, j, g, c, true);
          }
    std::vector<double> sc(size_t(past + t));
    for (int64_t n = 0; n < b; ++n)
      for (int64_t head = 0; head < h; ++head) {
        const int64_t g = head / (h / kv);
        for (int64_t i = 0; i < t; ++i) {
          const int64_t keys = past + i + 1;
          double mx = -1e300;
          for (int64_t j = 0; j < keys; ++j) {
            double dot = 0;
            for (int64_t c = 0; c < d; ++c) dot += x[size_t((n * t + i) * row + head * d + c)] * key(n, j, g, c, false);
            sc[size_t(j)] = dot / std::sqrt(double(d));
            mx = std::max(mx, sc[size_t(j)]);
          }
          double sum = 0;
          for (int64_t j = 0; j < keys; ++j) sum += std::exp(sc[size_t(j)] - mx);
          r.out("lse")[size_t((n * h + head) * t + i)] = mx + std::log(sum);
          for (int64_t c = 0; c < d; ++c) {
            double o = 0;
            for (int64_t j = 0; j < keys; ++j) o += std::exp(sc[size_t(j)] - mx) / sum * key(n, j, g, c, true);
            r.out("out")[size_t(((n * t + i) * h + head) * d + c)] = o;
          }
        }
      }
  };
  oc.fp32_only = true;                        // generation: the KV-cache ops are fp32 only (kernels/ops.h)
  oc.cuda = form == cpu::AttentionIsa::blas;  // the CUDA cache write and cached forward, once
  return oc;
}

double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += double(a[i] - b[i]) * (a[i] - b[i]), den += double(b[i]) * b[i];
  return std::sqrt(num / den);
}

}  // namespace

TEST_P(Attention, CachedDecodingMatchesReference) {
  run_case(cached_case(GetParam(), 1, 0, 1, 2, 2, 8, 3), 1100);     // the first token of a sequence
  run_case(cached_case(GetParam(), 2, 37, 1, 4, 2, 16, 0), 1101);   // one new token over a long past, GQA, full cache
  run_case(cached_case(GetParam(), 1, 30, 40, 2, 2, 64, 5), 1102);  // a prompt chunk across query blocks
  run_case(cached_case(GetParam(), 2, 5, 9, 6, 1, 5, 2), 1103);     // multi-query, odd head dim
  run_case(cached_case(GetParam(), 1, 64, 33, 3, 3, 48, 1), 1104);  // keys past two blocks, 48 = 3 AVX-512 vectors
}

TEST_P(Attention, CachedChunksGiveTheFullSequenceResult) {
  // A sequence fed to the cache in chunks gives, row for row, what attention_forward gives over
  // the whole sequence at once (the model's generation relies on it).
  const int64_t b = 2, t = 71, h = 4, kv = 2, d = 16, row = (h + 2 * kv) * d;
  std::mt19937_64 rng(77);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> qkv(size_t(b * t * row));
  for (auto& x : qkv) x = normal(rng);
  std::vector<float> want(size_t(b * t * h * d)), want_lse(size_t(b * h * t));
  attention_forward(host_tensor(want.data(), {b, t, h, d}), host_tensor(want_lse.data(), {b, h, t}),
                    host_tensor(qkv.data(), {b, t, h + 2 * kv, d}), h, kv);

  std::vector<float> kc(size_t(b * t * kv * d)), vc(kc.size()), got(want.size());
  const Tensor k_cache = host_tensor(kc.data(), {b, t, kv, d}), v_cache = host_tensor(vc.data(), {b, t, kv, d});
  int64_t pos = 0;
  for (int64_t len : {5, 1, 1, 33, 2, 29}) {
    std::vector<float> chunk(size_t(b * len * row)), out(size_t(b * len * h * d)), lse(size_t(b * h * len));
    for (int64_t s = 0; s < b; ++s)
      std::copy_n(qkv.begin() + (s * t + pos) * row, len * row, chunk.begin() + s * len * row);
    const Tensor c = host_tensor(chunk.data(), {b, len, h + 2 * kv, d});
    kv_cache_write(k_cache, v_cache, c, h, kv, pos);
    attention_cached_forward(host_tensor(out.data(), {b, len, h, d}), host_tensor(lse.data(), {b, h, len}), c, k_cache,
                             v_cache, h, kv, pos);
    for (int64_t s = 0; s < b; ++s)
      std::copy_n(out.begin() + s * len * h * d, len * h * d, got.begin() + (s * t + pos) * h * d);
    pos += len;
  }
  ASSERT_EQ(pos, t);
  EXPECT_LE(rel(got, want), 1e-6);
}

TEST_P(Attention, MultiHeadMatchesReference) {
  run_case(attention_case(GetParam(), 2, 1, 2, 2, 4), 1000);   // one token
  run_case(attention_case(GetParam(), 1, 13, 3, 3, 8), 1001);  // within one query block
  run_case(attention_case(GetParam(), 2, 64, 2, 2, 5), 1002);  // exactly two blocks, odd head dim
}

TEST_P(Attention, AcrossQueryBlocks) {
  run_case(attention_case(GetParam(), 1, 130, 2, 2, 16), 1003);
  run_case(attention_case(GetParam(), 2, 77, 1, 1, 32), 1004);
  run_case(attention_case(GetParam(), 1, 150, 2, 2, 64), 1007);  // GPT-2's head dim, keys not a multiple of 32
  run_case(attention_case(GetParam(), 1, 67, 1, 1, 40), 1008);   // head dim 32 + 8: every chunk width
  run_case(attention_case(GetParam(), 1, 45, 1, 1, 48), 1009);   // 48 = 3 AVX-512 vectors
  run_case(attention_case(GetParam(), 1, 35, 2, 1, 128), 1010);  // the largest head dim: 4 threads per row on CUDA
}

TEST_P(Attention, GroupedQueryHeads) {
  run_case(attention_case(GetParam(), 2, 70, 4, 2, 8), 1005);
  run_case(attention_case(GetParam(), 1, 19, 6, 1, 6), 1006);  // multi-query
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
