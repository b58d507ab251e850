// Mixture of experts (kernels/cpu/moe.cpp, kernels/cuda/moe.cu): the router with its load-balancing
// and z losses, gather, combine and the grouped product through the op harness (double reference,
// finite differences, 16-bit storage, the CUDA device against the CPU); the plan and the stats
// exactly against a naive reference; broken invariants reported; and the whole forward and backward
// (router, plan, stats, gather, grouped product, combine) against a dense double loop, the same on
// every thread count and run to run, and the CUDA device against the CPU.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/backend_info.h"
#include "kernels/buffer.h"
#include "kernels/ops.h"
#include "op_harness.h"

namespace llmtrain::kernels::test {

namespace {

// The plan as its contract says, the naive way: each expert's assignments in increasing a.
struct Plan {
  std::vector<int32_t> order, pos, offsets;
};
Plan reference_plan(const std::vector<int32_t>& expert, int64_t experts, int64_t capacity) {
  const int64_t m = int64_t(expert.size());
  Plan p{std::vector<int32_t>(size_t(m), -1), std::vector<int32_t>(size_t(m), -1),
         std::vector<int32_t>(size_t(experts + 1), 0)};
  int32_t row = 0;
  for (int64_t e = 0; e < experts; ++e) {
    int64_t kept = 0;
    for (int64_t a = 0; a < m; ++a) {
      if (expert[size_t(a)] != e || (capacity > 0 && kept == capacity)) continue;
      p.order[size_t(row)] = int32_t(a);
      p.pos[size_t(a)] = row++;
      ++kept;
    }
    p.offsets[size_t(e + 1)] = row;
  }
  return p;
}

std::vector<int32_t> random_experts(std::mt19937_64& rng, int64_t m, int64_t experts) {
  std::vector<int32_t> ex(static_cast<size_t>(m));
  std::uniform_int_distribution<int32_t> pick(0, int32_t(experts - 1));
  for (auto& x : ex) x = pick(rng);
  return ex;
}

// The top k of p in double: descending, equal probs to the lower expert first.
std::vector<int> reference_top_k(const std::vector<double>& p, int64_t k) {
  std::vector<int> idx(p.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return p[size_t(a)] > p[size_t(b)]; });
  idx.resize(size_t(k));
  return idx;
}

bool have_cuda_device() {
  const CudaInfo c = cuda_info();
  return c.built && !c.devices.empty();
}

// Host vectors as tensors on a device (copies for Device::cuda, written back by fetch()).
class OnDevice {
 public:
  explicit OnDevice(Device d) : device_(d) {}
  template <class T>
  Tensor put(std::vector<T>& v, std::vector<int64_t> shape) {
    Tensor host(v.data(), DTypeOf<T>::value, Shape(std::span<const int64_t>(shape)));
    if (device_ == Device::cpu) return host;
    buffers_.emplace_back(host.dtype, host.shape, device_);
    copy(buffers_.back().tensor(), host);
    hosts_.push_back(host);
    return buffers_.back().tensor();
  }
  void fetch() {
    for (size_t i = 0; i < hosts_.size(); ++i) copy(hosts_[i], buffers_[i].tensor());
  }

 private:
  Device device_;
  std::deque<Buffer> buffers_;
  std::vector<Tensor> hosts_;
};

std::vector<Device> devices() {
  std::vector<Device> d = {Device::cpu};
  if (have_cuda_device()) d.push_back(Device::cuda);
  return d;
}

}  // namespace

// ---- the router ---------------------------------------------------------------------------------

TEST(MoeRouter, ForwardBackwardMatchReference) {
  std::mt19937_64 rng(3100);
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t n = rand_dim(rng, 1, 24), c = rand_dim(rng, 1, 40), e = rand_dim(rng, 2, 9),
                  k = rand_dim(rng, 1, std::min<int64_t>(e, 4));
    const bool renormalize = trial % 2 == 1, bias = trial >= 3;  // gpt-oss's router has a bias
    const float aux_coef = 0.01f * float(trial + 1), z_coef = 0.002f * float(trial + 1);
    OpCase oc{.name = "moe_router n=" + std::to_string(n) + " c=" + std::to_string(c) + " e=" + std::to_string(e) +
                      " k=" + std::to_string(k) + (renormalize ? " renormalized" : "") + (bias ? " bias" : ""),
              .args = {{"in", {n, c}, Role::param},  // din accumulates: Role::param checks that
                       {"router", {e, c}, Role::param, 0, 0, 2.0 / std::sqrt(double(c))},
                       {"expert", {n * k}, Role::index, 0, int32_t(e)},  // written by the forward
                       {"stats", {2 * e + 2}, Role::constant},           // written by the forward
                       {"probs", {n, e}, Role::saved},
                       {"lse", {n}, Role::saved},
                       {"expert_ids", {n * k}, Role::saved},  // expert as floats, to compare
                       {"weight", {n * k}, Role::output},
                       // aux_coef · L_aux + z_coef · L_z, with R = loss_scale
                       {"reg", {1}, Role::output, 0, 0, 1.0, /*uniform_dout=*/true}}};
    if (bias) oc.args.push_back({"bias", {e}, Role::param});
    oc.fp32_args = {"stats", "probs", "lse", "expert_ids", "weight", "reg"};
    oc.forward = [=](OpRun& r) {
      moe_router_forward(r.t("probs"), r.t("lse"), r.t("expert"), r.t("weight"), r.t("in"), r.t("router"),
                         bias ? r.t("bias") : Tensor{}, k, renormalize);
      std::vector<int32_t> order(static_cast<size_t>(n * k)), pos(static_cast<size_t>(n * k)),
          offsets(static_cast<size_t>(e + 1));
      const Tensor off = r.ints(offsets.data(), e + 1);
      moe_route_plan(r.ints(order.data(), n * k), r.ints(pos.data(), n * k), off, r.t("expert"), e, 0);
      moe_route_stats(r.t("stats"), r.t("probs"), r.t("lse"), r.t("expert"), off);
      r.sync();
      const auto& st = r.f["stats"];
      double reg = z_coef * double(st[size_t(2 * e)]) / double(n);
      for (int64_t q = 0; q < e; ++q)
        reg += double(aux_coef) * double(e) * (st[size_t(q)] / double(n * k)) * (st[size_t(e + q)] / double(n));
      r.f["reg"][0] = float(reg);
      for (int64_t a = 0; a < n * k; ++a) r.f["expert_ids"][size_t(a)] = float(r.i["expert"][size_t(a)]);
    };
    oc.backward = [=](OpRun& r) {
      moe_router_backward(r.grad("in"), r.grad("router"), bias ? r.grad("bias") : Tensor{}, r.grad("weight"),
                          r.t("probs"), r.t("lse"), r.t("expert"), r.t("stats"), r.t("in"), r.t("router"), k,
                          renormalize, aux_coef, z_coef, r.g["reg"][0]);
    };
    oc.reference = [=](RefRun& r) {
      const auto &x = r.in("in"), &w = r.in("router");
      std::vector<double> count(static_cast<size_t>(e)), psum(static_cast<size_t>(e)), p(static_cast<size_t>(e));
      double zsum = 0;
      for (int64_t i = 0; i < n; ++i) {
        double mx = -1e300, sum = 0;
        for (int64_t q = 0; q < e; ++q) {
          double l = 0;
          for (int64_t j = 0; j < c; ++j) l += x[size_t(i * c + j)] * w[size_t(q * c + j)];
          p[size_t(q)] = bias ? l + r.in("bias")[size_t(q)] : l;
          mx = std::max(mx, l);
        }
        for (int64_t q = 0; q < e; ++q) sum += std::exp(p[size_t(q)] - mx);
        const double lse = mx + std::log(sum);
        for (int64_t q = 0; q < e; ++q) {
          p[size_t(q)] = std::exp(p[size_t(q)] - lse);
          r.out("probs")[size_t(i * e + q)] = p[size_t(q)];
          psum[size_t(q)] += p[size_t(q)];
        }
        r.out("lse")[size_t(i)] = lse;
        zsum += lse * lse;
        const std::vector<int> top = reference_top_k(p, k);
        double picked = 0;
        for (int q : top) picked += p[size_t(q)];
        for (int64_t j = 0; j < k; ++j) {
          const int q = top[size_t(j)];
          r.out("expert_ids")[size_t(i * k + j)] = q;
          r.out("weight")[size_t(i * k + j)] = renormalize ? p[size_t(q)] / picked : p[size_t(q)];
          count[size_t(q)] += 1;
        }
      }
      double reg = z_coef * zsum / double(n);
      for (int64_t q = 0; q < e; ++q)
        reg += double(aux_coef) * double(e) * (count[size_t(q)] / double(n * k)) * (psum[size_t(q)] / double(n));
      r.out("reg")[0] = reg;
    };
    // A renormalized top-1 weight is 1 whatever the logits, so that case's gradient is the small aux
    // and z terms alone, next to the rounding of a 16-bit accumulated gradient's start.
    oc.bf16 = {1e-5, 0.1};
    oc.fp16 = {1e-5, 1e-2};
    oc.cuda = true;  // the device's expf and warp sums
    oc.cuda_bf16 = 1e-2;
    oc.cuda_fp16 = 2e-3;
    run_case(oc, 3200 + trial);
  }
}

// ---- the plan and the stats, exactly -----------------------------------------------------------

TEST(MoeRoutePlan, CountingSortKeepsTheFirstCapacityOfEachExpert) {
  std::mt19937_64 rng(3300);
  for (Device d : devices()) {
    SCOPED_TRACE(to_string(d));
    for (int trial = 0; trial < 8; ++trial) {
      const int64_t experts = rand_dim(rng, 1, 12), m = rand_dim(rng, 1, 700);
      // dropless, a capacity that drops, one that drops nearly everything, one that drops nothing
      const int64_t capacity = trial % 4 == 0   ? 0
                               : trial % 4 == 1 ? std::max<int64_t>(1, m / experts / 2)
                               : trial % 4 == 2 ? 1
                                                : m + 1;
      std::vector<int32_t> expert = random_experts(rng, m, experts);
      std::vector<int32_t> order(static_cast<size_t>(m), 77), pos(static_cast<size_t>(m), 77),
          offsets(static_cast<size_t>(experts + 1), 77);
      OnDevice on(d);
      moe_route_plan(on.put(order, {m}), on.put(pos, {m}), on.put(offsets, {experts + 1}), on.put(expert, {m}), experts,
                     capacity);
      on.fetch();
      const Plan want = reference_plan(expert, experts, capacity);
      EXPECT_EQ(order, want.order) << "experts " << experts << " m " << m << " capacity " << capacity;
      EXPECT_EQ(pos, want.pos);
      EXPECT_EQ(offsets, want.offsets);
    }
  }
}

TEST(MoeRouteStats, CountsAndSumsInDoubleRoundedOnce) {
  std::mt19937_64 rng(3400);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (Device d : devices()) {
    SCOPED_TRACE(to_string(d));
    for (int trial = 0; trial < 4; ++trial) {
      const int64_t n = rand_dim(rng, 1, 300), e = rand_dim(rng, 1, 10), k = rand_dim(rng, 1, e), m = n * k;
      std::vector<float> probs(static_cast<size_t>(n * e)), lse(static_cast<size_t>(n)),
          stats(static_cast<size_t>(2 * e + 2), -1.0f);
      for (auto& x : probs) x = std::abs(normal(rng));
      for (auto& x : lse) x = 3.0f * normal(rng);
      std::vector<int32_t> expert = random_experts(rng, m, e);
      const int64_t capacity = trial % 2 ? std::max<int64_t>(1, m / e / 2) : 0;
      Plan plan = reference_plan(expert, e, capacity);
      OnDevice on(d);
      moe_route_stats(on.put(stats, {2 * e + 2}), on.put(probs, {n, e}), on.put(lse, {n}), on.put(expert, {m}),
                      on.put(plan.offsets, {e + 1}));
      on.fetch();
      for (int64_t q = 0; q < e; ++q) {
        EXPECT_EQ(stats[size_t(q)], float(std::count(expert.begin(), expert.end(), int32_t(q))));
        double s = 0;
        for (int64_t i = 0; i < n; ++i) s += double(probs[size_t(i * e + q)]);
        EXPECT_EQ(stats[size_t(e + q)], float(s));
      }
      double z = 0;
      for (float l : lse) z += double(l) * double(l);
      EXPECT_EQ(stats[size_t(2 * e)], float(z));
      EXPECT_EQ(stats[size_t(2 * e + 1)], float(m - plan.offsets[size_t(e)]));
    }
  }
}

TEST(MoeRoutePlanDeathTest, AnExpertIdOutsideTheExpertsStopsWithItsPosition) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<int32_t> expert = {1, 0, 4, 2}, order(4), pos(4), offsets(5);
  EXPECT_DEATH(moe_route_plan(host_tensor(order.data(), {4}), host_tensor(pos.data(), {4}),
                              host_tensor(offsets.data(), {5}), host_tensor(expert.data(), {4}), 4, 0),
               "expert id 4 at position 2 is outside the experts \\[0, 4\\)");
  expert[2] = -1;
  EXPECT_DEATH(moe_route_plan(host_tensor(order.data(), {4}), host_tensor(pos.data(), {4}),
                              host_tensor(offsets.data(), {5}), host_tensor(expert.data(), {4}), 4, 1),
               "expert id -1 at position 2 is outside the experts");
}

TEST(MoeRoutePlanDeathTest, AnExpertIdOutsideTheExpertsStopsTheCudaKernel) {
  const CudaInfo cuda = cuda_info();
  if (!cuda.built || cuda.devices.empty()) GTEST_SKIP() << "no CUDA device (build with -DLLMTRAIN_CUDA=SIM)";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<int32_t> expert = {1, 0, 4, 2}, host(4);
  Buffer dex(DType::int32, {4}, Device::cuda), order(DType::int32, {4}, Device::cuda),
      pos(DType::int32, {4}, Device::cuda), offsets(DType::int32, {5}, Device::cuda);
  copy(dex.tensor(), host_tensor(expert.data(), {4}));
  // As the embedding's test: the simulator stops with the message, a GPU's trap surfaces at the
  // next synchronising call (the copy back).
  EXPECT_DEATH(
      {
        try {
          moe_route_plan(order.tensor(), pos.tensor(), offsets.tensor(), dex.tensor(), 4, 0);
          copy(host_tensor(host.data(), {4}), pos.tensor());
        } catch (const std::exception& e) {
          std::fprintf(stderr, "%s\n", e.what());
          std::_Exit(1);
        }
      },
      cuda.simulator ? "expert id 4 at position 2 is outside the experts \\[0, 4\\)"
                     : "cudaErrorLaunchFailure|cudaErrorIllegalInstruction|cudaErrorAssert");
}

// ---- gather and combine ------------------------------------------------------------------------

TEST(MoeGather, ForwardBackwardMatchReference) {
  std::mt19937_64 rng(3500);
  for (int trial = 0; trial < 4; ++trial) {
    const int64_t n = rand_dim(rng, 1, 30), c = rand_dim(rng, 1, 50), e = rand_dim(rng, 1, 6), k = rand_dim(rng, 1, e);
    const int64_t capacity = trial % 2 ? std::max<int64_t>(1, n * k / e / 2) : 0;
    const Plan plan = reference_plan(random_experts(rng, n * k, e), e, capacity);
    OpCase oc{.name = "moe_gather n=" + std::to_string(n) + " c=" + std::to_string(c) + " k=" + std::to_string(k) +
                      " capacity=" + std::to_string(capacity),
              .args = {{"in", {n, c}, Role::input},
                       {"order", {n * k}, Role::index, 0, 1},
                       {"pos", {n * k}, Role::index, 0, 1},
                       {"out", {n * k, c}, Role::output}}};
    oc.setup = [=](OpRun& r) {
      r.i["order"] = plan.order;
      r.i["pos"] = plan.pos;
    };
    oc.forward = [=](OpRun& r) { moe_gather_forward(r.t("out"), r.t("in"), r.t("order"), k); };
    oc.backward = [=](OpRun& r) { moe_gather_backward(r.grad("in"), r.grad("out"), r.t("pos")); };
    oc.reference = [=](RefRun& r) {
      for (int64_t q = 0; q < n * k; ++q) {
        const int32_t a = r.ints("order")[size_t(q)];
        for (int64_t j = 0; j < c; ++j)
          r.out("out")[size_t(q * c + j)] = a < 0 ? 0.0 : r.in("in")[size_t(a / k * c + j)];
      }
    };
    oc.bf16 = {1e-6, 5e-3};
    oc.fp16 = {1e-6, 8e-4};
    oc.cuda = true;  // the same sums in the same order
    oc.cuda_bf16 = 1e-6;
    oc.cuda_fp16 = 1e-6;
    run_case(oc, 3600 + trial);
  }
}

TEST(MoeCombine, ForwardBackwardMatchReference) {
  std::mt19937_64 rng(3700);
  for (int trial = 0; trial < 4; ++trial) {
    const int64_t n = rand_dim(rng, 1, 30), c = rand_dim(rng, 1, 70), e = rand_dim(rng, 1, 6), k = rand_dim(rng, 1, e);
    const int64_t capacity = trial % 2 ? std::max<int64_t>(1, n * k / e / 2) : 0;
    const Plan plan = reference_plan(random_experts(rng, n * k, e), e, capacity);
    OpCase oc{.name = "moe_combine n=" + std::to_string(n) + " c=" + std::to_string(c) + " k=" + std::to_string(k) +
                      " capacity=" + std::to_string(capacity),
              .args = {{"y", {n * k, c}, Role::input},
                       {"weight", {n * k}, Role::input},
                       {"pos", {n * k}, Role::index, 0, 1},
                       {"out", {n, c}, Role::output}}};
    oc.fp32_args = {"weight"};
    oc.setup = [=](OpRun& r) { r.i["pos"] = plan.pos; };
    oc.forward = [=](OpRun& r) { moe_combine_forward(r.t("out"), r.t("y"), r.t("weight"), r.t("pos")); };
    oc.backward = [=](OpRun& r) {
      moe_combine_backward(r.grad("y"), r.grad("weight"), r.grad("out"), r.t("y"), r.t("weight"), r.t("pos"));
    };
    oc.reference = [=](RefRun& r) {
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < k; ++j) {
          const int32_t q = r.ints("pos")[size_t(i * k + j)];
          if (q < 0) continue;
          for (int64_t t = 0; t < c; ++t)
            r.out("out")[size_t(i * c + t)] += r.in("weight")[size_t(i * k + j)] * r.in("y")[size_t(q * c + t)];
        }
    };
    oc.bf16 = {6e-3, 6e-3};
    oc.fp16 = {8e-4, 1.2e-3};
    oc.cuda = true;  // dweight: a warp's shuffle sums against the CPU's loop
    oc.cuda_bf16 = 2e-3;
    oc.cuda_fp16 = 5e-4;
    run_case(oc, 3800 + trial);
  }
}

// ---- the shared expert's gate (Qwen2-MoE) ------------------------------------------------------

// out = base + σ(in · gate_w) ⊙ y, the three ops in a row: the forward into a copy of base (the op
// accumulates), the backward's two halves with no reduction between them (tp 1).
TEST(MoeSharedGate, ForwardBackwardMatchReference) {
  std::mt19937_64 rng(3900);
  for (int trial = 0; trial < 4; ++trial) {
    const int64_t n = rand_dim(rng, 1, 30), c = rand_dim(rng, 1, 50), d = trial == 3 ? c : rand_dim(rng, 1, 70);
    OpCase oc{.name = "moe_shared_gate n=" + std::to_string(n) + " c=" + std::to_string(c) + " d=" + std::to_string(d),
              .args = {{"base", {n, d}, Role::input},
                       {"y", {n, d}, Role::input},
                       {"in", {n, c}, Role::input},
                       {"gate_w", {c}, Role::param, 0, 0, trial == 2 ? 3.0 : 0.5},
                       {"dlogit", {n}, Role::constant},
                       {"out", {n, d}, Role::output},
                       {"gate", {n}, Role::saved}}};
    oc.fp32_args = {"gate", "dlogit"};
    oc.forward = [=](OpRun& r) {
      copy(r.t("out"), r.t("base"));
      moe_shared_gate_forward(r.t("out"), r.t("gate"), r.t("y"), r.t("in"), r.t("gate_w"));
    };
    oc.backward = [=](OpRun& r) {
      copy(r.grad("base"), r.grad("out"));
      moe_shared_gate_backward(r.grad("y"), r.t("dlogit"), r.grad("out"), r.t("y"), r.t("gate"));
      fill_zero(r.grad("in"));
      moe_shared_gate_weight_backward(r.grad("in"), r.grad("gate_w"), r.t("dlogit"), r.t("in"), r.t("gate_w"));
    };
    oc.reference = [=](RefRun& r) {
      for (int64_t i = 0; i < n; ++i) {
        double logit = 0;
        for (int64_t j = 0; j < c; ++j) logit += r.in("in")[size_t(i * c + j)] * r.in("gate_w")[size_t(j)];
        const double g = 1.0 / (1.0 + std::exp(-logit));
        r.out("gate")[size_t(i)] = g;
        for (int64_t j = 0; j < d; ++j)
          r.out("out")[size_t(i * d + j)] = r.in("base")[size_t(i * d + j)] + g * r.in("y")[size_t(i * d + j)];
      }
    };
    // The directional derivatives sum every stored gradient element's rounding (dy = gate · dout
    // rounded to 16 bits, elementwise): a random walk over up to 2000 of them.
    oc.bf16 = {6e-3, 8e-3, 5e-2};
    oc.fp16 = {1e-3, 1.5e-3, 8e-3};
    oc.cuda = true;  // the dot products: a warp's shuffle sums against the CPU's loop
    oc.cuda_bf16 = 4e-3;
    oc.cuda_fp16 = 1e-3;
    run_case(oc, 4000 + trial);
  }
}

// A recomputation (no out): the gate alone, the same as with out.
TEST(MoeSharedGate, GateAloneWithoutOutput) {
  std::vector<float> in = {1.0f, -2.0f, 0.5f, 400.0f, -3.0f, 1000.0f}, w = {0.25f, 1.0f, -0.5f};
  std::vector<float> y(6, 1.0f), gate(2, 0.0f);
  moe_shared_gate_forward(Tensor{}, Tensor(gate.data(), DType::fp32, {2}), Tensor(y.data(), DType::fp32, {2, 3}),
                          Tensor(in.data(), DType::fp32, {2, 3}), Tensor(w.data(), DType::fp32, {3}));
  EXPECT_NEAR(gate[0], 1.0 / (1.0 + std::exp(-(0.25 - 2.0 - 0.25))), 1e-6);
  EXPECT_EQ(gate[1], 0.0f);  // logit −403: σ underflows to 0, finite (no exp overflow)
}

// ---- the experts' grouped product --------------------------------------------------------------

TEST(GroupedLinear, ForwardBackwardMatchReference) {
  std::mt19937_64 rng(3900);
  for (int trial = 0; trial < 5; ++trial) {
    const int64_t e = rand_dim(rng, 1, 5), m = rand_dim(rng, 1, 90), o = rand_dim(rng, 1, 70),
                  i_dim = rand_dim(rng, 1, 80);
    const bool no_din = trial == 2, bias = trial % 2 == 1;  // gpt-oss's experts have biases
    // Random non-decreasing offsets inside [0, m]: empty experts, a tail of unused rows, and once
    // rows before offsets[0] (also unused, written 0).
    std::vector<int32_t> offsets(static_cast<size_t>(e + 1));
    std::uniform_int_distribution<int32_t> cut(0, int32_t(m));
    for (auto& x : offsets) x = cut(rng);
    std::sort(offsets.begin(), offsets.end());
    if (trial != 3) offsets[0] = 0;
    if (trial == 0) offsets[size_t(e)] = int32_t(m);
    std::string cuts;
    for (int32_t x : offsets) cuts += " " + std::to_string(x);
    OpCase oc{.name = "grouped_linear e=" + std::to_string(e) + " m=" + std::to_string(m) + " o=" + std::to_string(o) +
                      " i=" + std::to_string(i_dim) + " offsets" + cuts + (no_din ? " no din" : "") +
                      (bias ? " bias" : ""),
              .args = {{"in", {m, i_dim}, no_din ? Role::constant : Role::input},
                       {"weight", {e, o, i_dim}, Role::param, 0, 0, 1.0 / std::sqrt(double(i_dim))},
                       {"offsets", {e + 1}, Role::index, 0, 1},
                       {"out", {m, o}, Role::output}}};
    if (bias) oc.args.push_back({"bias", {e, o}, Role::param});
    oc.setup = [=](OpRun& r) { r.i["offsets"] = offsets; };
    oc.forward = [=](OpRun& r) {
      grouped_linear_forward(r.t("out"), r.t("in"), r.t("weight"), bias ? r.t("bias") : Tensor{}, r.t("offsets"));
    };
    oc.backward = [=](OpRun& r) {
      grouped_linear_backward(no_din ? Tensor{} : r.grad("in"), r.grad("weight"), bias ? r.grad("bias") : Tensor{},
                              r.grad("out"), r.t("in"), r.t("weight"), r.t("offsets"));
    };
    oc.reference = [=](RefRun& r) {
      const auto &x = r.in("in"), &w = r.in("weight");
      for (int64_t q = 0; q < e; ++q)
        for (int64_t row = offsets[size_t(q)]; row < offsets[size_t(q + 1)]; ++row)
          for (int64_t u = 0; u < o; ++u) {
            double s = 0;
            for (int64_t j = 0; j < i_dim; ++j) s += x[size_t(row * i_dim + j)] * w[size_t((q * o + u) * i_dim + j)];
            r.out("out")[size_t(row * o + u)] = bias ? s + r.in("bias")[size_t(q * o + u)] : s;
          }
    };
    oc.bf16 = {6e-3, 4e-2};
    oc.fp16 = {8e-4, 4e-3};
    oc.cuda = true;  // our tiled GEMM against OpenBLAS
    oc.cuda_bf16 = 4e-3;
    oc.cuda_fp16 = 1e-3;
    run_case(oc, 4000 + trial);
  }
}

TEST(GroupedLinearDeathTest, OffsetsThatDecreaseOrPassTheRowsStop) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<float> in(6 * 2), w(2 * 3 * 2), out(6 * 3);
  std::vector<int32_t> offsets = {0, 4, 3};
  auto run = [&] {
    grouped_linear_forward(host_tensor(out.data(), {6, 3}), host_tensor(in.data(), {6, 2}),
                           host_tensor(w.data(), {2, 3, 2}), Tensor{}, host_tensor(offsets.data(), {3}));
  };
  EXPECT_DEATH(run(), "expert offsets\\[2\\] = 3 after offsets\\[1\\] = 4");
  offsets = {0, 4, 7};
  EXPECT_DEATH(run(), "expert offsets\\[2\\] = 7 after offsets\\[1\\] = 4: .* within the 6 rows");
  const CudaInfo cuda = cuda_info();
  if (!cuda.built || cuda.devices.empty()) return;
  Buffer din(DType::fp32, {6, 2}, Device::cuda), dw(DType::fp32, {2, 3, 2}, Device::cuda),
      dout(DType::fp32, {6, 3}, Device::cuda), doff(DType::int32, {3}, Device::cuda);
  offsets = {0, 4, 3};
  copy(doff.tensor(), host_tensor(offsets.data(), {3}));
  EXPECT_DEATH(
      {
        try {
          grouped_linear_forward(dout.tensor(), din.tensor(), dw.tensor(), Tensor{}, doff.tensor());
          copy(host_tensor(out.data(), {6, 3}), dout.tensor());
        } catch (const std::exception& e) {
          std::fprintf(stderr, "%s\n", e.what());
          std::_Exit(1);
        }
      },
      cuda.simulator ? "expert offsets\\[2\\] = 3 after offsets\\[1\\] = 4"
                     : "cudaErrorLaunchFailure|cudaErrorIllegalInstruction|cudaErrorAssert");
}

// ---- the layer, composed -----------------------------------------------------------------------

namespace {

struct Layer {
  int64_t n, c, h, e, k, capacity;
  bool renormalize;
  float aux_coef = 0.01f, z_coef = 0.001f, loss_scale = 0.5f;
};

// Everything one forward and backward of the layer computes (host copies).
struct LayerRun {
  std::vector<float> probs, lse, weight, stats, xs, ys, out;  // forward
  std::vector<int32_t> expert, order, pos, offsets;           // forward
  std::vector<float> dys, dweight, dxs, dw, dx, drouter;      // backward
};

// router → plan → stats → gather → grouped product → combine, and back, on one device.
LayerRun run_layer(const Layer& s, Device d, std::vector<float> in, std::vector<float> router, std::vector<float> w,
                   std::vector<float> dout) {
  const int64_t m = s.n * s.k;
  LayerRun r;
  r.probs.assign(size_t(s.n * s.e), 0);
  r.lse.assign(size_t(s.n), 0);
  r.weight.assign(size_t(m), 0);
  r.stats.assign(size_t(2 * s.e + 2), 0);
  r.xs.assign(size_t(m * s.c), 0);
  r.ys.assign(size_t(m * s.h), 0);
  r.out.assign(size_t(s.n * s.h), 0);
  r.expert.assign(size_t(m), 0);
  r.order.assign(size_t(m), 0);
  r.pos.assign(size_t(m), 0);
  r.offsets.assign(size_t(s.e + 1), 0);
  r.dys.assign(size_t(m * s.h), 0);
  r.dweight.assign(size_t(m), 0);
  r.dxs.assign(size_t(m * s.c), 0);
  r.dw.assign(w.size(), 0);
  r.dx.assign(size_t(s.n * s.c), 0);
  r.drouter.assign(router.size(), 0);
  OnDevice on(d);
  const Tensor tin = on.put(in, {s.n, s.c}), trouter = on.put(router, {s.e, s.c}), tw = on.put(w, {s.e, s.h, s.c}),
               tdout = on.put(dout, {s.n, s.h});
  const Tensor probs = on.put(r.probs, {s.n, s.e}), lse = on.put(r.lse, {s.n}), weight = on.put(r.weight, {m}),
               stats = on.put(r.stats, {2 * s.e + 2}), xs = on.put(r.xs, {m, s.c}), ys = on.put(r.ys, {m, s.h}),
               out = on.put(r.out, {s.n, s.h}), expert = on.put(r.expert, {m}), order = on.put(r.order, {m}),
               pos = on.put(r.pos, {m}), offsets = on.put(r.offsets, {s.e + 1}), dys = on.put(r.dys, {m, s.h}),
               dweight = on.put(r.dweight, {m}), dxs = on.put(r.dxs, {m, s.c}), dw = on.put(r.dw, {s.e, s.h, s.c}),
               dx = on.put(r.dx, {s.n, s.c}), drouter = on.put(r.drouter, {s.e, s.c});
  moe_router_forward(probs, lse, expert, weight, tin, trouter, Tensor{}, s.k, s.renormalize);
  moe_route_plan(order, pos, offsets, expert, s.e, s.capacity);
  moe_route_stats(stats, probs, lse, expert, offsets);
  moe_gather_forward(xs, tin, order, s.k);
  grouped_linear_forward(ys, xs, tw, Tensor{}, offsets);
  moe_combine_forward(out, ys, weight, pos);
  moe_combine_backward(dys, dweight, tdout, ys, weight, pos);
  grouped_linear_backward(dxs, dw, Tensor{}, dys, xs, tw, offsets);
  moe_gather_backward(dx, dxs, pos);
  moe_router_backward(dx, drouter, Tensor{}, dweight, probs, lse, expert, stats, tin, trouter, s.k, s.renormalize,
                      s.aux_coef, s.z_coef, s.loss_scale);
  on.fetch();
  return r;
}

// The layer's output as a dense double loop: every token through its kept experts' matrices.
std::vector<double> dense_layer(const Layer& s, const std::vector<float>& in, const std::vector<float>& router,
                                const std::vector<float>& w) {
  std::vector<double> out(static_cast<size_t>(s.n * s.h), 0.0), p(static_cast<size_t>(s.e));
  std::vector<int64_t> taken(static_cast<size_t>(s.e), 0);
  for (int64_t i = 0; i < s.n; ++i) {
    double mx = -1e300, sum = 0;
    for (int64_t q = 0; q < s.e; ++q) {
      double l = 0;
      for (int64_t j = 0; j < s.c; ++j) l += double(in[size_t(i * s.c + j)]) * router[size_t(q * s.c + j)];
      p[size_t(q)] = l;
      mx = std::max(mx, l);
    }
    for (double l : p) sum += std::exp(l - mx);
    for (auto& l : p) l = std::exp(l - mx) / sum;
    const std::vector<int> top = reference_top_k(p, s.k);
    double picked = 0;
    for (int q : top) picked += p[size_t(q)];
    for (int q : top) {  // assignments in increasing a: token order, then pick order
      if (s.capacity > 0 && taken[size_t(q)]++ >= s.capacity) continue;
      const double wq = s.renormalize ? p[size_t(q)] / picked : p[size_t(q)];
      for (int64_t u = 0; u < s.h; ++u) {
        double y = 0;
        for (int64_t j = 0; j < s.c; ++j) y += double(w[size_t((q * s.h + u) * s.c + j)]) * in[size_t(i * s.c + j)];
        out[size_t(i * s.h + u)] += wq * y;
      }
    }
  }
  return out;
}

std::vector<double> doubles(const std::vector<float>& v) { return {v.begin(), v.end()}; }

void expect_same(const LayerRun& a, const LayerRun& b, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(a.probs, b.probs);
  EXPECT_EQ(a.lse, b.lse);
  EXPECT_EQ(a.weight, b.weight);
  EXPECT_EQ(a.expert, b.expert);
  EXPECT_EQ(a.order, b.order);
  EXPECT_EQ(a.pos, b.pos);
  EXPECT_EQ(a.offsets, b.offsets);
  EXPECT_EQ(a.stats, b.stats);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.dweight, b.dweight);
  EXPECT_EQ(a.dw, b.dw);
  EXPECT_EQ(a.dx, b.dx);
  EXPECT_EQ(a.drouter, b.drouter);
}

}  // namespace

TEST(MoeLayer, ComposedOpsMatchADenseLoopAndAreDeterministic) {
  std::mt19937_64 rng(4100);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const Layer layers[] = {{.n = 37, .c = 24, .h = 20, .e = 5, .k = 2, .capacity = 0, .renormalize = true},
                          {.n = 300, .c = 64, .h = 40, .e = 8, .k = 2, .capacity = 60, .renormalize = false},
                          {.n = 150, .c = 16, .h = 70, .e = 4, .k = 1, .capacity = 30, .renormalize = false}};
  for (const Layer& s : layers) {
    SCOPED_TRACE("n " + std::to_string(s.n) + " e " + std::to_string(s.e) + " k " + std::to_string(s.k) + " capacity " +
                 std::to_string(s.capacity));
    auto random = [&](int64_t count, float scale) {
      std::vector<float> v(static_cast<size_t>(count));
      for (auto& x : v) x = scale * normal(rng);
      return v;
    };
    const auto in = random(s.n * s.c, 1.0f), router = random(s.e * s.c, 1.0f / std::sqrt(float(s.c))),
               w = random(s.e * s.h * s.c, 1.0f / std::sqrt(float(s.c))), dout = random(s.n * s.h, 1.0f);
    const LayerRun cpu = run_layer(s, Device::cpu, in, router, w, dout);
    EXPECT_LE(rel_error(doubles(cpu.out), dense_layer(s, in, router, w)), 1e-5);
    if (s.capacity > 0) {
      EXPECT_GT(cpu.stats[size_t(2 * s.e + 1)], 0.0f) << "this layer should drop assignments";
    }

    // The same bits whatever the thread count (the larger layer runs every op on several threads),
    // and run to run.
    const int threads = omp_get_max_threads();
    set_cpu_threads(1);
    const LayerRun one = run_layer(s, Device::cpu, in, router, w, dout);
    set_cpu_threads(threads);
    expect_same(one, cpu, "one CPU thread against " + std::to_string(threads));
    expect_same(run_layer(s, Device::cpu, in, router, w, dout), cpu, "CPU run to run");

    if (!have_cuda_device()) continue;
    const LayerRun cuda = run_layer(s, Device::cuda, in, router, w, dout);
    expect_same(run_layer(s, Device::cuda, in, router, w, dout), cuda, "CUDA run to run");
    EXPECT_EQ(cuda.expert, cpu.expert);
    EXPECT_EQ(cuda.order, cpu.order);
    EXPECT_EQ(cuda.pos, cpu.pos);
    EXPECT_EQ(cuda.offsets, cpu.offsets);
    for (auto [name, a, b] : {std::tuple{"probs", &cuda.probs, &cpu.probs},
                              {"weight", &cuda.weight, &cpu.weight},
                              {"stats", &cuda.stats, &cpu.stats},
                              {"out", &cuda.out, &cpu.out},
                              {"dweight", &cuda.dweight, &cpu.dweight},
                              {"dw", &cuda.dw, &cpu.dw},
                              {"dx", &cuda.dx, &cpu.dx},
                              {"drouter", &cuda.drouter, &cpu.drouter}})
      EXPECT_LE(rel_error(doubles(*a), doubles(*b)), 1e-5) << name << " on the CUDA device against the CPU";
  }
}

}  // namespace llmtrain::kernels::test
