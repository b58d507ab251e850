// Attention (kernels/cpu/attention.cpp, kernels/cuda/attention.cu) through the op harness: causal
// grouped-query self-attention over the packed layout at sequence lengths below, at and across the
// kernels' 32-row blocks; the general op of a query block over a key/value block (heads at offsets
// inside their tensors, blocks at other positions, causal and fully visible masks, sliding
// windows, k and v in one tensor) with its log-sum-exp statistics; merging two partial results;
// and the KV-cache form (kv_cache_write + attention_cached_forward). Then the property context
// parallelism builds on: attention over keys split in two blocks, merged by lse, gives the whole
// one's output, and the blocks' gradients (from the final out and lse) give its gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend_info.h"
#include "kernels/buffer.h"
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

// The same in general: query head h of `q_name` (at head spec.q_head + h of its rows) over the keys
// of `k_name` / `v_name` that spec's mask shows it (positions spec.q_begin + i, spec.kv_begin + j).
struct BlockShape {
  int64_t b, tq, tk, d;
  int64_t q_width, k_width, v_width;  // heads per row of q, k, v
  AttentionSpec spec;
  bool sinks = false;  // gpt-oss's attention sinks: an input "sinks" [heads]
};

void reference_block(RefRun& r, const BlockShape& s, const std::string& q_name, const std::string& k_name,
                     const std::string& v_name) {
  const auto &q = r.in(q_name), &k = r.in(k_name), &v = r.in(v_name);
  auto &out = r.out("out"), &lse = r.out("lse");
  const AttentionSpec& sp = s.spec;
  const int64_t h = sp.heads, d = s.d;
  std::vector<double> sc(size_t(s.tk));
  for (int64_t n = 0; n < s.b; ++n)
    for (int64_t head = 0; head < h; ++head) {
      const int64_t g = head / (h / sp.kv_heads);
      for (int64_t i = 0; i < s.tq; ++i) {
        const int64_t pos = sp.q_begin + i;
        const double* qi = &q[size_t(((n * s.tq + i) * s.q_width + sp.q_head + head) * d)];
        auto key = [&](int64_t j) { return &k[size_t(((n * s.tk + j) * s.k_width + sp.k_head + g) * d)]; };
        auto val = [&](int64_t j) { return &v[size_t(((n * s.tk + j) * s.v_width + sp.v_head + g) * d)]; };
        auto visible = [&](int64_t j) {
          const int64_t kp = sp.kv_begin + j;
          return (!sp.causal || kp <= pos) && (sp.window == 0 || kp > pos - sp.window);
        };
        // A sink: one more key of logit sinks[head] and value 0.
        const double sink = s.sinks ? r.in("sinks")[size_t(head)] : -1e300;
        double mx = sink;
        for (int64_t j = 0; j < s.tk; ++j) {
          if (!visible(j)) continue;
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += qi[c] * key(j)[c];
          sc[size_t(j)] = dot * (sp.scale > 0 ? sp.scale : 1.0 / std::sqrt(double(d)));
          mx = std::max(mx, sc[size_t(j)]);
        }
        double sum = s.sinks ? std::exp(sink - mx) : 0.0;
        for (int64_t j = 0; j < s.tk; ++j)
          if (visible(j)) sum += std::exp(sc[size_t(j)] - mx);
        lse[size_t((n * h + head) * s.tq + i)] = mx + std::log(sum);
        for (int64_t c = 0; c < d; ++c) {
          double o = 0;
          for (int64_t j = 0; j < s.tk; ++j)
            if (visible(j)) o += std::exp(sc[size_t(j)] - mx) / sum * val(j)[c];
          out[size_t(((n * s.tq + i) * h + head) * d + c)] = o;
        }
      }
    }
}

std::string describe(const std::string& what, const BlockShape& s) {
  const AttentionSpec& p = s.spec;
  return what + " b=" + std::to_string(s.b) + " tq=" + std::to_string(s.tq) + " tk=" + std::to_string(s.tk) +
         " heads=" + std::to_string(p.heads) + "/" + std::to_string(p.kv_heads) + " d=" + std::to_string(s.d) +
         " q at " + std::to_string(p.q_begin) + " kv at " + std::to_string(p.kv_begin) +
         (p.causal ? " causal" : " full") + (p.window ? " window=" + std::to_string(p.window) : "");
}

// The 16-bit tolerances of every attention case. The directional derivative's (the third) is looser
// than the element-wise one: over a whole qkv argument, the rounding of the stored output and dout
// that the gradient is computed from adds up (measured, LLMTRAIN_OP_VERBOSE=1, 2026-12-02, every
// case of this file: at most 5.1e-2 bf16 and 5.7e-3 fp16 on the CPU, 4.3e-2 and 6.1e-3 on the
// tensor cores; element-wise at most 3.8e-3 and 4.9e-4).
constexpr OpCase::Tolerances kBf16{5e-3, 2e-2, 0.15}, kFp16{6e-4, 4e-3, 2e-2};

// Where the device takes a case on the tensor cores (kernels::cuda_attention_on_tensor_cores: bf16
// and fp16 at head dims that are multiples of 16 up to 256), its 16-bit runs round P and dS to 16
// bits where the CPU keeps them in fp32: they are checked against the double reference too, and
// against the CPU's run at 3× the largest difference measured in the simulator (2026-12-02, every
// case of this file: 3.3e-3 bf16, 4.3e-4 fp16; the CUDA cores' kernel: 2e-3 and 5e-4 as before).
void on_tensor_cores(OpCase& oc, int64_t d) {
  if (!cuda_attention_on_tensor_cores(DType::bf16, d)) return;
  oc.cuda_reference = true;
  oc.cuda_bf16 = 1e-2;
  oc.cuda_fp16 = 1.5e-3;
}

// A query block over a key/value block, q, k and v in tensors of their own (`kv_together`: k and v
// share one [B, Tk, k_width, D] tensor, as a block received from another rank does). The heads
// outside the spec's take no part: their gradients stay as the harness set them (0, hence
// check_overwrite off; the packed cases check that gradients are overwritten).
OpCase block_case(cpu::AttentionIsa form, const std::string& what, const BlockShape& s, bool kv_together = false) {
  const AttentionSpec& sp = s.spec;
  OpCase oc{.name = describe(what, s),
            .args = {{"q", {s.b, s.tq, s.q_width, s.d}, Role::input},
                     {"k", {s.b, s.tk, s.k_width, s.d}, Role::input},
                     {"out", {s.b, s.tq, sp.heads, s.d}, Role::output},
                     {"lse", {s.b, sp.heads, s.tq}, Role::saved}}};
  const std::string v_name = kv_together ? "k" : "v";
  if (!kv_together) oc.args.push_back({"v", {s.b, s.tk, s.v_width, s.d}, Role::input});
  if (s.sinks) oc.args.push_back({"sinks", {sp.heads}, Role::param});  // its gradient accumulates
  const bool sinks = s.sinks;
  oc.forward = [=](OpRun& r) {
    attention_forward(r.t("out"), r.t("lse"), r.t("q"), r.t("k"), r.t(v_name), sinks ? r.t("sinks") : Tensor{}, sp);
  };
  oc.backward = [=](OpRun& r) {
    attention_backward(r.grad("q"), r.grad("k"), r.grad(v_name), sinks ? r.grad("sinks") : Tensor{}, r.grad("out"),
                       r.t("q"), r.t("k"), r.t(v_name), r.t("out"), r.t("lse"), sinks ? r.t("sinks") : Tensor{}, sp);
  };
  oc.reference = [=](RefRun& r) { reference_block(r, s, "q", "k", v_name); };
  oc.check_overwrite = false;
  oc.bf16 = kBf16;
  oc.fp16 = kFp16;
  oc.fp32_args = {"lse"};
  oc.cuda = form == cpu::AttentionIsa::blas;
  oc.cuda_bf16 = 2e-3;
  oc.cuda_fp16 = 5e-4;
  on_tensor_cores(oc, s.d);
  return oc;
}

// attention_merge, in place on (out, lse): out_a and lse_a are copied in first.
OpCase merge_case(int64_t b, int64_t t, int64_t h, int64_t d) {
  OpCase oc{.name = "attention_merge b=" + std::to_string(b) + " t=" + std::to_string(t) +
                    " heads=" + std::to_string(h) + " d=" + std::to_string(d),
            .args = {{"out_a", {b, t, h, d}, Role::constant},
                     {"lse_a", {b, h, t}, Role::constant, 0, 0, 3.0},
                     {"out_b", {b, t, h, d}, Role::constant},
                     {"lse_b", {b, h, t}, Role::constant, 0, 0, 3.0},
                     {"out", {b, t, h, d}, Role::output},
                     {"lse", {b, h, t}, Role::saved}}};
  oc.forward = [](OpRun& r) {
    r.f["out"] = r.f["out_a"];
    r.f["lse"] = r.f["lse_a"];
    attention_merge(r.t("out"), r.t("lse"), r.t("out_b"), r.t("lse_b"));
  };
  oc.reference = [=](RefRun& r) {
    const auto &oa = r.in("out_a"), &la = r.in("lse_a"), &ob = r.in("out_b"), &lb = r.in("lse_b");
    for (int64_t n = 0; n < b; ++n)
      for (int64_t i = 0; i < t; ++i)
        for (int64_t head = 0; head < h; ++head) {
          const size_t l = size_t((n * h + head) * t + i);
          const double lse = std::log(std::exp(la[l]) + std::exp(lb[l]));
          r.out("lse")[l] = lse;
          for (int64_t c = 0; c < d; ++c) {
            const size_t e = size_t(((n * t + i) * h + head) * d + c);
            r.out("out")[e] = oa[e] * std::exp(la[l] - lse) + ob[e] * std::exp(lb[l] - lse);
          }
        }
  };
  oc.bf16 = {4e-3, 1};
  oc.fp16 = {6e-4, 1};
  oc.fp32_args = {"lse_a", "lse_b", "lse"};
  oc.cuda = true;
  oc.cuda_bf16 = 2e-3;
  oc.cuda_fp16 = 5e-4;
  return oc;
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
  oc.bf16 = kBf16;
  oc.fp16 = kFp16;
  oc.fp32_args = {"lse"};
  // The flash-style CUDA kernels against the CPU (once, in the blas form's run: the CUDA side does
  // not depend on the CPU's form).
  oc.cuda = form == cpu::AttentionIsa::blas;
  oc.cuda_bf16 = 2e-3;
  oc.cuda_fp16 = 5e-4;
  on_tensor_cores(oc, d);
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

TEST_P(Attention, BlockAtOtherPositions) {
  const AttentionSpec gqa{.heads = 4, .kv_heads = 2, .q_head = 1, .k_head = 1, .v_head = 0};
  // Keys all before the queries (context parallelism's earlier chunks): every key visible.
  AttentionSpec before = gqa;
  before.q_begin = 40;
  run_case(block_case(GetParam(), "keys before", {1, 20, 24, 8, 6, 3, 2, before}), 1200);
  // The diagonal block seen from later: query row 0 at position 30 sees keys 10..30.
  AttentionSpec diagonal = gqa;
  diagonal.q_begin = 30;
  diagonal.kv_begin = 10;
  run_case(block_case(GetParam(), "diagonal", {1, 37, 50, 16, 5, 3, 2, diagonal}), 1201);
}

TEST_P(Attention, FullyVisibleBlock) {
  const AttentionSpec full{.heads = 2, .kv_heads = 1, .q_head = 0, .k_head = 0, .v_head = 1, .causal = false};
  run_case(block_case(GetParam(), "full", {1, 33, 45, 16, 2, 2, 2, full}), 1202);
  // k and v in one [B, Tk, 2·kv_heads, D] tensor, a block of another rank's keys.
  const AttentionSpec kv_block{.heads = 4, .kv_heads = 2, .q_head = 0, .k_head = 0, .v_head = 2, .causal = false};
  run_case(block_case(GetParam(), "kv block", {1, 9, 40, 8, 4, 4, 4, kv_block}, true), 1203);
}

TEST_P(Attention, SlidingWindow) {
  const AttentionSpec window{.heads = 2, .kv_heads = 2, .q_head = 0, .k_head = 0, .v_head = 0, .window = 17};
  run_case(block_case(GetParam(), "window", {1, 70, 70, 8, 2, 2, 2, window}), 1204);
  // A window reaching back into an earlier block, and one wider than the sequence (no effect).
  AttentionSpec reaching{.heads = 3, .kv_heads = 1, .q_head = 0, .k_head = 0, .v_head = 0, .window = 25};
  reaching.q_begin = 50;
  reaching.kv_begin = 20;
  run_case(block_case(GetParam(), "window reaching back", {1, 30, 60, 16, 3, 1, 1, reaching}), 1205);
  AttentionSpec wide{.heads = 1, .kv_heads = 1, .q_head = 0, .k_head = 0, .v_head = 0, .window = 1000};
  run_case(block_case(GetParam(), "wide window", {1, 41, 41, 5, 1, 1, 1, wide}), 1206);
}

// gpt-oss's attention sinks (a logit per query head in the softmax's denominator) with their
// gradient: GQA with a window (gpt-oss's local layers), keys before the queries, a row that sees no
// key but its sink (out 0, lse the sink), and full visibility.
TEST_P(Attention, Sinks) {
  AttentionSpec windowed{.heads = 4, .kv_heads = 2, .q_head = 0, .k_head = 0, .v_head = 0, .window = 7};
  run_case(block_case(GetParam(), "sinks, window", {2, 40, 40, 8, 4, 2, 2, windowed, true}), 1209);
  AttentionSpec before{.heads = 2, .kv_heads = 1, .q_head = 0, .k_head = 0, .v_head = 1};
  before.q_begin = 30;
  before.kv_begin = 10;
  run_case(block_case(GetParam(), "sinks, keys before", {1, 21, 25, 16, 2, 2, 2, before, true}), 1210);
  AttentionSpec unseen{.heads = 2, .kv_heads = 2, .q_head = 0, .k_head = 0, .v_head = 0};
  unseen.kv_begin = 5;  // rows 0–4 see no key
  run_case(block_case(GetParam(), "sinks, rows without keys", {1, 12, 12, 8, 2, 2, 2, unseen, true}), 1211);
  const AttentionSpec full{.heads = 3, .kv_heads = 3, .q_head = 0, .k_head = 0, .v_head = 0, .causal = false};
  run_case(block_case(GetParam(), "sinks, full", {1, 9, 33, 8, 3, 3, 3, full, true}), 1212);
}

// A softmax scale of its own (Gemma's query_pre_attn_scalar^-1/2), with a window, GQA and keys before.
TEST_P(Attention, OwnSoftmaxScale) {
  AttentionSpec scaled{.heads = 4, .kv_heads = 2, .q_head = 0, .k_head = 0, .v_head = 0, .window = 9, .scale = 0.6};
  scaled.q_begin = 40;
  scaled.kv_begin = 25;
  run_case(block_case(GetParam(), "scale 0.6", {1, 30, 45, 8, 4, 2, 2, scaled}), 1207);
  const AttentionSpec small{.heads = 2, .kv_heads = 1, .q_head = 0, .k_head = 0, .v_head = 1, .scale = 0.05};
  run_case(block_case(GetParam(), "scale 0.05", {2, 21, 21, 16, 2, 2, 2, small}), 1208);
}

// The tensor-core kernels (kernels/cuda/attention_tc.cu: bf16 and fp16 storage, head dims that are
// multiples of 16 up to 256) at every head dim to 128, across tiles, with every mask and position;
// the cases above with such head dims take them too (on_tensor_cores). The head dims past 128 are in
// TensorCoreAttentionFull (scripts/test.sh --full), slow in the simulator.
TEST(TensorCoreAttention, HeadDimsAcrossTiles) {
  const auto blas = cpu::AttentionIsa::blas;
  for (int64_t d : {16, 32, 48, 64, 80, 96, 128})
    run_case((attention_case(blas, 1, 23 + d / 4, 2, 1, d)), 1400 + uint64_t(d));
  run_case((attention_case(blas, 2, 70, 4, 2, 64)), 1500);  // past one 64-row tile, GQA
}

TEST(TensorCoreAttention, MasksAndPositions) {
  const auto blas = cpu::AttentionIsa::blas;
  AttentionSpec diagonal{.heads = 4, .kv_heads = 2, .q_head = 1, .k_head = 1, .v_head = 0};
  diagonal.q_begin = 30;
  diagonal.kv_begin = 10;
  run_case((block_case(blas, "tc diagonal", {1, 37, 50, 32, 5, 3, 2, diagonal})), 1501);
  const AttentionSpec full{.heads = 2, .kv_heads = 1, .q_head = 0, .k_head = 0, .v_head = 1, .causal = false};
  run_case((block_case(blas, "tc full", {1, 33, 45, 64, 2, 2, 2, full})), 1502);
  const AttentionSpec kv_block{.heads = 4, .kv_heads = 2, .q_head = 0, .k_head = 0, .v_head = 2, .causal = false};
  run_case((block_case(blas, "tc kv block", {1, 9, 40, 16, 4, 4, 4, kv_block}, true)), 1503);
  AttentionSpec reaching{.heads = 3, .kv_heads = 1, .q_head = 0, .k_head = 0, .v_head = 0, .window = 25};
  reaching.q_begin = 50;
  reaching.kv_begin = 20;
  run_case((block_case(blas, "tc window reaching back", {1, 30, 60, 32, 3, 1, 1, reaching})), 1504);
  AttentionSpec before{.heads = 2, .kv_heads = 2, .q_head = 0, .k_head = 0, .v_head = 0};
  before.q_begin = 80;
  run_case((block_case(blas, "tc keys before", {1, 20, 70, 16, 2, 2, 2, before})), 1505);
  AttentionSpec scaled{.heads = 2, .kv_heads = 1, .q_head = 0, .k_head = 0, .v_head = 1, .window = 12, .scale = 0.3};
  run_case((block_case(blas, "tc scale 0.3", {1, 40, 40, 32, 2, 2, 2, scaled})), 1506);
  AttentionSpec sunk{.heads = 4, .kv_heads = 2, .q_head = 0, .k_head = 0, .v_head = 0, .window = 16};
  run_case((block_case(blas, "tc sinks", {1, 50, 50, 64, 4, 2, 2, sunk, true})), 1507);
}

TEST(TensorCoreAttentionFull, LargeHeadDims) {
  const auto blas = cpu::AttentionIsa::blas;
  // The fp32 kernels stop at head dim 128: these run on the device in 16-bit storage only.
  auto no_fp32 = [](OpCase oc) {
    oc.cuda_fp32 = false;
    return oc;
  };
  for (int64_t d : {144, 192, 256}) run_case(no_fp32(attention_case(blas, 1, 40, 2, 1, d)), 1600 + uint64_t(d));
  AttentionSpec window{.heads = 2, .kv_heads = 1, .q_head = 0, .k_head = 0, .v_head = 0, .window = 19};
  run_case(no_fp32(block_case(blas, "tc window d=256", {1, 70, 70, 256, 2, 1, 1, window})), 1700);
}

TEST(AttentionMerge, MatchesReference) {
  run_case(merge_case(2, 5, 3, 8), 1300);
  run_case(merge_case(1, 33, 2, 64), 1301);
}

namespace {

// Host vectors as tensors on one device, read back after the ops ran.
struct DeviceTensors {
  Device device;
  std::vector<Buffer> buffers;
  Tensor put(const std::vector<float>& host, Shape shape) {
    buffers.emplace_back(DType::fp32, shape, device);
    copy(buffers.back().tensor(), host_tensor(host.data(), shape));
    return buffers.back().tensor();
  }
  Tensor zeros(Shape shape) {
    buffers.emplace_back(DType::fp32, shape, device);
    return buffers.back().tensor();
  }
  static std::vector<float> get(const Tensor& t) {
    std::vector<float> host(size_t(t.numel()));
    copy(host_tensor(host.data(), t.shape), t);
    return host;
  }
};

std::vector<Device> devices() {
  std::vector<Device> d{Device::cpu};
  const CudaInfo c = cuda_info();
  if (c.built && !c.devices.empty()) d.push_back(Device::cuda);
  return d;
}

std::vector<float> normal_values(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

// Rows [begin, end) of every sequence of a [B, T, ...] host tensor with `row` floats per token.
std::vector<float> rows_of(const std::vector<float>& x, int64_t b, int64_t t, int64_t row, int64_t begin, int64_t end) {
  std::vector<float> out;
  for (int64_t s = 0; s < b; ++s)
    out.insert(out.end(), x.begin() + (s * t + begin) * row, x.begin() + (s * t + end) * row);
  return out;
}

}  // namespace

// Context parallelism's arithmetic: the keys split in two blocks (the second one invisible to the
// first half of the queries, whose rows then come out with lse = -inf), each attended separately
// and merged by lse, give the whole attention's output and lse; and each block's backward, given
// the final out and lse, gives its share of the gradients: dq sums over the blocks, dk and dv are
// the whole's rows of each block.
TEST(AttentionBlocks, SplitKeysMergeToTheWhole) {
  const int64_t b = 2, t = 52, h = 4, kv = 2, d = 16, half = 21, width = 2 * kv;
  const std::vector<float> q = normal_values(size_t(b * t * h * d), 1400);
  const std::vector<float> kvs = normal_values(size_t(b * t * width * d), 1401);
  const std::vector<float> dout = normal_values(size_t(b * t * h * d), 1402);
  const AttentionSpec whole_spec{.heads = h, .kv_heads = kv, .q_head = 0, .k_head = 0, .v_head = kv};
  for (Device device : devices()) {
    SCOPED_TRACE(std::string("on ") + to_string(device));
    DeviceTensors dt{device, {}};
    const Tensor qt = dt.put(q, {b, t, h, d}), kvt = dt.put(kvs, {b, t, width, d}), dot = dt.put(dout, {b, t, h, d});
    const Tensor out = dt.zeros({b, t, h, d}), lse = dt.zeros({b, h, t});
    attention_forward(out, lse, qt, kvt, kvt, Tensor{}, whole_spec);
    const Tensor dq = dt.zeros({b, t, h, d}), dkv = dt.zeros({b, t, width, d});
    attention_backward(dq, dkv, dkv, Tensor{}, dot, qt, kvt, kvt, out, lse, Tensor{}, whole_spec);

    // The blocks: keys [0, half) and [half, t).
    const Tensor kv_a = dt.put(rows_of(kvs, b, t, width * d, 0, half), {b, half, width, d});
    const Tensor kv_b = dt.put(rows_of(kvs, b, t, width * d, half, t), {b, t - half, width, d});
    AttentionSpec spec_b = whole_spec;
    spec_b.kv_begin = half;
    const Tensor out_m = dt.zeros({b, t, h, d}), lse_m = dt.zeros({b, h, t});
    const Tensor out_b = dt.zeros({b, t, h, d}), lse_b = dt.zeros({b, h, t});
    attention_forward(out_m, lse_m, qt, kv_a, kv_a, Tensor{}, whole_spec);
    attention_forward(out_b, lse_b, qt, kv_b, kv_b, Tensor{}, spec_b);
    const std::vector<float> lse_b_host = DeviceTensors::get(lse_b), out_b_host = DeviceTensors::get(out_b);
    for (int64_t s = 0; s < b; ++s)
      for (int64_t head = 0; head < h; ++head)
        for (int64_t i = 0; i < half; ++i) {
          EXPECT_EQ(lse_b_host[size_t((s * h + head) * t + i)], -std::numeric_limits<float>::infinity())
              << "row " << i << " sees no key of the second block";
          for (int64_t c = 0; c < d; ++c) EXPECT_EQ(out_b_host[size_t(((s * t + i) * h + head) * d + c)], 0.0f);
        }
    attention_merge(out_m, lse_m, out_b, lse_b);
    EXPECT_LE(rel(DeviceTensors::get(out_m), DeviceTensors::get(out)), 1e-6);
    EXPECT_LE(rel(DeviceTensors::get(lse_m), DeviceTensors::get(lse)), 1e-6);

    const Tensor dq_a = dt.zeros({b, t, h, d}), dq_b = dt.zeros({b, t, h, d});
    const Tensor dkv_a = dt.zeros({b, half, width, d}), dkv_b = dt.zeros({b, t - half, width, d});
    attention_backward(dq_a, dkv_a, dkv_a, Tensor{}, dot, qt, kv_a, kv_a, out, lse, Tensor{}, whole_spec);
    attention_backward(dq_b, dkv_b, dkv_b, Tensor{}, dot, qt, kv_b, kv_b, out, lse, Tensor{}, spec_b);
    std::vector<float> dq_sum = DeviceTensors::get(dq_a);
    const std::vector<float> dq_b_host = DeviceTensors::get(dq_b);
    for (size_t e = 0; e < dq_sum.size(); ++e) dq_sum[e] += dq_b_host[e];
    const std::vector<float> dkv_whole = DeviceTensors::get(dkv);
    EXPECT_LE(rel(dq_sum, DeviceTensors::get(dq)), 1e-5);
    EXPECT_LE(rel(DeviceTensors::get(dkv_a), rows_of(dkv_whole, b, t, width * d, 0, half)), 1e-5);
    EXPECT_LE(rel(DeviceTensors::get(dkv_b), rows_of(dkv_whole, b, t, width * d, half, t)), 1e-5);
  }
}

// Keys all after the queries (causal): nothing is visible, so out is 0 and lse -inf; the backward
// writes zero gradients; and merging such a part into another changes nothing.
TEST(AttentionBlocks, InvisibleBlockIsEmpty) {
  const int64_t b = 1, t = 40, h = 2, d = 8;
  const std::vector<float> q = normal_values(size_t(b * t * h * d), 1500), k = normal_values(q.size(), 1501);
  const std::vector<float> v = normal_values(q.size(), 1502);
  const AttentionSpec later{.heads = h, .kv_heads = h, .q_head = 0, .k_head = 0, .v_head = 0, .kv_begin = t};
  for (Device device : devices()) {
    SCOPED_TRACE(std::string("on ") + to_string(device));
    DeviceTensors dt{device, {}};
    const Tensor qt = dt.put(q, {b, t, h, d}), kt = dt.put(k, {b, t, h, d}), vt = dt.put(v, {b, t, h, d});
    const Tensor out = dt.put(q, {b, t, h, d}), lse = dt.zeros({b, h, t});
    attention_forward(out, lse, qt, kt, vt, Tensor{}, later);
    for (float x : DeviceTensors::get(out)) ASSERT_EQ(x, 0.0f);
    for (float x : DeviceTensors::get(lse)) ASSERT_EQ(x, -std::numeric_limits<float>::infinity());
    const Tensor dq = dt.put(q, {b, t, h, d}), dk = dt.put(q, {b, t, h, d}), dv = dt.put(q, {b, t, h, d});
    const Tensor own_out = dt.put(v, {b, t, h, d}),
                 own_lse = dt.put(std::vector<float>(size_t(b * h * t), 1.5f), {b, h, t});
    attention_backward(dq, dk, dv, Tensor{}, dt.put(k, {b, t, h, d}), qt, kt, vt, own_out, own_lse, Tensor{}, later);
    for (const Tensor& g : {dq, dk, dv})
      for (float x : DeviceTensors::get(g)) ASSERT_EQ(x, 0.0f);
    attention_merge(own_out, own_lse, out, lse);
    EXPECT_EQ(DeviceTensors::get(own_out), v);
    for (float x : DeviceTensors::get(own_lse)) ASSERT_EQ(x, 1.5f);
  }
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
