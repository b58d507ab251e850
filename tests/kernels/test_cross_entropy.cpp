// Softmax cross-entropy over padded logits (kernels/cpu/cross_entropy.cpp): padding columns
// excluded, ignored rows, in-place backward, NaN propagation, bad targets; the vocab-parallel
// pieces (shard max, shard sums, combine, shard backward) composed over column shards; and the
// masked loss mean (loss_mean_forward) and the backward's count against a double reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>

#include "kernels/backend_info.h"
#include "kernels/buffer.h"
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
      // With a count of 1 the per-row gradient is loss_scale itself: the uniform dloss R.
      const float dloss = r.g["losses"][0];
      int32_t one = 1;
      const Tensor count = r.ints(&one, 1);
      if (in_place) {
        std::vector<float> keep = r.f["logits"];
        cross_entropy_backward(r.t("logits"), r.t("logits"), r.t("lse"), r.t("targets"), vocab, kIgnore, dloss, count);
        r.sync();
        r.g["logits"] = r.f["logits"];
        r.f["logits"] = keep;
      } else {
        cross_entropy_backward(r.grad("logits"), r.t("logits"), r.t("lse"), r.t("targets"), vocab, kIgnore, dloss,
                               count);
        r.sync();  // `one` ends here
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
    oc.bf16 = {1e-6, 6e-3};
    oc.fp16 = {1e-6, 1e-3};
    oc.fp32_args = {"losses", "lse"};
    oc.cuda = true;  // the device's expf and a block's sums
    oc.cuda_bf16 = 2e-3;
    oc.cuda_fp16 = 5e-4;
    run_case(oc, 1100 + trial);
  }
}

// The vocab-parallel pieces on column shards, composed by hand (what the all-reduces of
// parallel::vocab_parallel_cross_entropy do): max of the shard maxima, sums of the shard sums; the
// losses, lse and every shard's gradient against a double reference, with padding columns (one
// shard holding only padding), an ignored row, and a target in each shard.
// Runs `op` with the tensors `ts` point to mirrored on `device`: copied there before, back after.
static void on(Device device, std::vector<Tensor*> ts, const std::function<void()>& op) {
  if (device == Device::cpu) return op();
  std::vector<Buffer> bufs;
  std::vector<Tensor> host;
  for (Tensor* t : ts) {
    host.push_back(*t);
    bufs.emplace_back(t->dtype, t->shape, device);
    copy(bufs.back().tensor(), *t);
    *t = bufs.back().tensor();
  }
  op();
  for (size_t k = 0; k < ts.size(); ++k) {
    copy(host[k], bufs[k].tensor());
    *ts[k] = host[k];
  }
}

static void shards_compose(Device device) {
  constexpr int64_t n = 7, vocab = 45, vpad = 64, shards = 4, vl = vpad / shards;
  std::mt19937_64 rng(95);
  std::normal_distribution<float> z(0.0f, 2.0f);
  std::vector<float> x(n * vpad);
  for (float& v : x) v = z(rng);
  std::vector<int32_t> targets = {0, 16, kIgnore, 44, 31, 17, 5};
  std::vector<float> row_max(n, -INFINITY), stats(2 * n, 0.0f), losses(n), lse(n);
  std::vector<std::vector<float>> local(shards, std::vector<float>(n * vl));
  for (int64_t k = 0; k < shards; ++k)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < vl; ++j) local[size_t(k)][size_t(i * vl + j)] = x[size_t(i * vpad + k * vl + j)];
  Tensor t = host_tensor(targets.data(), {n});
  for (int64_t k = 0; k < shards; ++k) {
    std::vector<float> m(n);
    Tensor tm = host_tensor(m.data(), {n}), tl = host_tensor(local[size_t(k)].data(), {n, vl});
    on(device, {&tm, &tl}, [&] { cross_entropy_shard_max(tm, tl, k * vl, vocab); });
    for (int64_t i = 0; i < n; ++i) row_max[size_t(i)] = std::max(row_max[size_t(i)], m[size_t(i)]);
  }
  for (int64_t k = 0; k < shards; ++k) {
    std::vector<float> st(2 * n);
    Tensor ts = host_tensor(st.data(), {2 * n}), tl = host_tensor(local[size_t(k)].data(), {n, vl}),
           tm = host_tensor(row_max.data(), {n});
    on(device, {&ts, &tl, &tm, &t}, [&] { cross_entropy_shard_sums(ts, tl, tm, t, k * vl, vocab, kIgnore); });
    for (int64_t i = 0; i < 2 * n; ++i) stats[size_t(i)] += st[size_t(i)];
  }
  {
    Tensor tlo = host_tensor(losses.data(), {n}), tls = host_tensor(lse.data(), {n}),
           tm = host_tensor(row_max.data(), {n}), ts = host_tensor(stats.data(), {2 * n});
    on(device, {&tlo, &tls, &tm, &ts, &t}, [&] { cross_entropy_combine(tlo, tls, tm, ts, t, vocab, kIgnore); });
  }
  int32_t count = n - 1;
  for (int64_t i = 0; i < n; ++i) {
    double mx = -1e300, sum = 0;
    for (int64_t j = 0; j < vocab; ++j) mx = std::max(mx, double(x[size_t(i * vpad + j)]));
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(double(x[size_t(i * vpad + j)]) - mx);
    const double want_lse = mx + std::log(sum);
    EXPECT_NEAR(lse[size_t(i)], want_lse, 1e-5 * std::abs(want_lse)) << "row " << i;
    const int32_t tg = targets[size_t(i)];
    const double want_loss = tg == kIgnore ? 0.0 : want_lse - x[size_t(i * vpad + tg)];
    EXPECT_NEAR(losses[size_t(i)], want_loss, 1e-5 * std::abs(want_loss) + 1e-6) << "row " << i;
  }
  for (int64_t k = 0; k < shards; ++k) {
    std::vector<float> grad(n * vl);
    Tensor tg = host_tensor(grad.data(), {n, vl}), tl = host_tensor(local[size_t(k)].data(), {n, vl}),
           tls = host_tensor(lse.data(), {n}), tc(&count, DType::int32, {1});
    on(device, {&tg, &tl, &tls, &t, &tc},
       [&] { cross_entropy_shard_backward(tg, tl, tls, t, k * vl, vocab, kIgnore, 0.5f, tc); });
    for (int64_t i = 0; i < n; ++i) {
      const int32_t target = targets[size_t(i)];
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j < vocab; ++j) mx = std::max(mx, double(x[size_t(i * vpad + j)]));
      for (int64_t j = 0; j < vocab; ++j) sum += std::exp(double(x[size_t(i * vpad + j)]) - mx);
      const double want_lse = mx + std::log(sum);
      for (int64_t j = 0; j < vl; ++j) {
        const int64_t col = k * vl + j;
        double want = 0;
        if (target != kIgnore && col < vocab)
          want = 0.5 / count * (std::exp(double(x[size_t(i * vpad + col)]) - want_lse) - (col == target ? 1.0 : 0.0));
        EXPECT_NEAR(grad[size_t(i * vl + j)], want, 1e-6) << "row " << i << " column " << col;
      }
    }
  }
}

TEST(CrossEntropy, ShardsComposeToTheWholeVocabulary) { shards_compose(Device::cpu); }

// The same pieces on the CUDA device, against the same double reference.
TEST(CrossEntropy, ShardsComposeToTheWholeVocabularyOnTheCudaDevice) {
  const CudaInfo cuda = cuda_info();
  if (!cuda.built || cuda.devices.empty()) GTEST_SKIP() << "no CUDA device (build with -DLLMTRAIN_CUDA=SIM)";
  shards_compose(Device::cuda);
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

TEST(CrossEntropyDeathTest, ATargetOutsideTheVocabularyStopsWithItsPosition) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<float> logits(2 * 4, 0.5f), losses(2), lse(2);
  std::vector<int32_t> targets = {kIgnore, 3};  // 3: a padding column of a 3-id vocabulary
  EXPECT_DEATH(cross_entropy_forward(host_tensor(losses.data(), {2}), host_tensor(lse.data(), {2}),
                                     host_tensor(logits.data(), {2, 4}), host_tensor(targets.data(), {2}), 3, kIgnore),
               "target 3 at position 1 is outside the vocabulary \\[0, 3\\)");
  int32_t count = 1;
  EXPECT_DEATH(cross_entropy_backward(host_tensor(logits.data(), {2, 4}), host_tensor(logits.data(), {2, 4}),
                                      host_tensor(lse.data(), {2}), host_tensor(targets.data(), {2}), 3, kIgnore, 1.0f,
                                      host_tensor(&count, {1})),
               "target 3 at position 1 is outside the vocabulary");
}

// Soft-capping (Gemma's final logits): y = cap · tanh(x / cap) in place, and its gradient from the
// capped values, against the double formula and its finite differences; logits past ±cap included.
TEST(Softcap, ForwardBackwardMatchReference) {
  std::mt19937_64 rng(94);
  for (int trial = 0; trial < 3; ++trial) {
    const int64_t n = rand_dim(rng, 1, 30), c = rand_dim(rng, 1, 200);
    const float cap = trial == 0 ? 30.0f : trial == 1 ? 2.0f : 0.5f;
    OpCase oc{.name = "softcap n=" + std::to_string(n) + " c=" + std::to_string(c) + " cap=" + std::to_string(cap),
              .args = {{"x", {n, c}, Role::input, 0, 0, 3.0}, {"y", {n, c}, Role::output}}};
    oc.forward = [=](OpRun& r) {
      copy(r.t("y"), r.t("x"));
      softcap_forward(r.t("y"), cap);
    };
    oc.backward = [=](OpRun& r) { softcap_backward(r.grad("x"), r.grad("y"), r.t("y"), cap); };
    oc.reference = [=](RefRun& r) {
      for (int64_t i = 0; i < n * c; ++i) r.out("y")[i] = double(cap) * std::tanh(r.in("x")[i] / double(cap));
    };
    oc.bf16 = {6e-3, 4e-2};
    oc.fp16 = {6e-4, 3e-3};
    oc.cuda = true;
    oc.cuda_bf16 = 2e-3;
    oc.cuda_fp16 = 5e-4;
    run_case(oc, 730 + uint64_t(trial));
  }
}

// The loss the model reports, through the op harness: cross_entropy_forward then
// loss_mean_forward, and the backward of loss_scale · mean (cross_entropy_backward taking the
// count from loss_mean_forward's tensor), against the mean over counted rows in double and its
// finite differences.
TEST(LossMean, MeanAndItsGradientMatchReference) {
  std::mt19937_64 rng(93);
  for (int trial = 0; trial < 5; ++trial) {
    const int64_t n = rand_dim(rng, 1, 40), vocab = rand_dim(rng, 2, 300), vpad = vocab + rand_dim(rng, 0, 20);
    const bool none_counted = trial == 0;
    auto count = std::make_shared<int32_t>(-1);
    OpCase oc{.name = "loss_mean n=" + std::to_string(n) + " vocab=" + std::to_string(vocab) +
                      (none_counted ? " nothing counted" : ""),
              .args = {{"logits", {n, vpad}, Role::input, 0, 0, 3.0},
                       {"targets", {n}, Role::index, 0, int32_t(vocab)},
                       {"losses", {n}, Role::saved},
                       {"lse", {n}, Role::saved},
                       {"mean", {1}, Role::output}}};
    oc.setup = [=](OpRun& r) {
      for (int64_t i = 0; i < n; ++i)
        if (none_counted || i % 3 == 1) r.i["targets"][size_t(i)] = kIgnore;
    };
    oc.forward = [=](OpRun& r) {
      cross_entropy_forward(r.t("losses"), r.t("lse"), r.t("logits"), r.t("targets"), vocab, kIgnore);
      loss_mean_forward(r.t("mean"), r.ints(count.get(), 1), r.t("losses"), r.t("targets"), kIgnore);
    };
    oc.backward = [=](OpRun& r) {
      cross_entropy_backward(r.grad("logits"), r.t("logits"), r.t("lse"), r.t("targets"), vocab, kIgnore,
                             r.g["mean"][0], r.ints(count.get(), 1));
    };
    oc.reference = [=](RefRun& r) {
      const auto& x = r.in("logits");
      double sum = 0;
      int64_t counted = 0;
      for (int64_t i = 0; i < n; ++i) {
        double mx = -1e300, total = 0;
        for (int64_t j = 0; j < vocab; ++j) mx = std::max(mx, x[i * vpad + j]);
        for (int64_t j = 0; j < vocab; ++j) total += std::exp(x[i * vpad + j] - mx);
        const double lse = mx + std::log(total);
        r.out("lse")[i] = lse;
        const int32_t t = r.ints("targets")[i];
        r.out("losses")[i] = t == kIgnore ? 0.0 : lse - x[i * vpad + t];
        if (t != kIgnore) sum += lse - x[i * vpad + t], ++counted;
      }
      r.out("mean")[0] = counted ? sum / double(counted) : 0.0;
    };
    oc.bf16 = {1e-6, 1e-2};
    oc.fp16 = {1e-6, 2e-3};
    oc.fp32_args = {"losses", "lse", "mean"};
    oc.cuda = true;
    oc.cuda_bf16 = 2e-3;
    oc.cuda_fp16 = 5e-4;
    run_case(oc, 1200 + trial);
    int64_t want = 0;
    for (int64_t i = 0; i < n; ++i) want += !(none_counted || i % 3 == 1);
    EXPECT_EQ(*count, want) << oc.name;
  }
}

// The rounding the model's reproducibility rests on: the sum in double in the op table's fixed
// order (lanes of rows, then their tree), one rounding to float at the end; 0 (not NaN) when
// nothing is counted.
TEST(LossMean, RoundsOnceFromADoubleSum) {
  std::vector<float> losses = {1e8f, 1.0f, 3.0f, -1e8f, 0.0f, 0.5f};
  std::vector<int32_t> targets = {4, 2, kIgnore, 0, kIgnore, 1};
  float mean = -1;
  int32_t count = -1;
  loss_mean_forward(host_tensor(&mean, {1}), host_tensor(&count, {1}), host_tensor(losses.data(), {6}),
                    host_tensor(targets.data(), {6}), kIgnore);
  EXPECT_EQ(count, 4);
  EXPECT_EQ(mean, float((1e8 + 1.0 - 1e8 + 0.5) / 4.0));  // a float sum would lose the 1.0
  std::fill(targets.begin(), targets.end(), kIgnore);
  loss_mean_forward(host_tensor(&mean, {1}), host_tensor(&count, {1}), host_tensor(losses.data(), {6}),
                    host_tensor(targets.data(), {6}), kIgnore);
  EXPECT_EQ(count, 0);
  EXPECT_EQ(mean, 0.0f);
}

// The device's loss mean (a thread per lane, then the lanes' tree) is the CPU's, bit for bit, over
// more rows than lanes: losses over 12 orders of magnitude (where any other order of the double
// sum would round differently), every seventh row ignored.
TEST(LossMean, OnTheDeviceIsTheCpusBitsOverManyRows) {
  const CudaInfo cuda = cuda_info();
  if (!cuda.built || cuda.devices.empty()) GTEST_SKIP() << "no CUDA device (build with -DLLMTRAIN_CUDA=SIM)";
  const int64_t n = 5003;
  std::mt19937_64 rng(97);
  std::normal_distribution<float> z(0.0f, 6.0f);
  std::vector<float> losses(n);
  std::vector<int32_t> targets(n);
  for (int64_t i = 0; i < n; ++i) {
    losses[size_t(i)] = std::exp(z(rng));
    targets[size_t(i)] = i % 7 == 3 ? kIgnore : int32_t(i % 11);
  }
  float mean[2] = {-1, -1};
  int32_t count[2] = {-1, -1};
  Tensor tm = host_tensor(&mean[0], {1}), tc = host_tensor(&count[0], {1}), tl = host_tensor(losses.data(), {n}),
         tt = host_tensor(targets.data(), {n});
  loss_mean_forward(tm, tc, tl, tt, kIgnore);
  Tensor dm = host_tensor(&mean[1], {1}), dc = host_tensor(&count[1], {1});
  on(Device::cuda, {&dm, &dc, &tl, &tt}, [&] { loss_mean_forward(dm, dc, tl, tt, kIgnore); });
  EXPECT_EQ(count[0], count[1]);
  EXPECT_EQ(std::memcmp(&mean[0], &mean[1], sizeof(float)), 0) << mean[0] << " " << mean[1];
  double exact = 0;
  for (int64_t i = 0; i < n; ++i)
    if (targets[size_t(i)] != kIgnore) exact += double(losses[size_t(i)]);
  EXPECT_NEAR(mean[0], exact / count[0], 1e-6 * exact / count[0]);
}

// Rows of GPT-2's vocabulary (50257 of 50304 padded columns, and unpadded so that rows start at
// every alignment) on the device against the CPU: the one-pass forward (online maximum and sum; one
// row's logits rise along the row, so its maximum moves at every step) and the backward, in fp32
// and bf16.
TEST(CrossEntropy, VocabSizeRowsOnTheDeviceMatchTheCpu) {
  const CudaInfo cuda = cuda_info();
  if (!cuda.built || cuda.devices.empty()) GTEST_SKIP() << "no CUDA device (build with -DLLMTRAIN_CUDA=SIM)";
  constexpr int64_t n = 3, vocab = 50257;
  std::mt19937_64 rng(98);
  std::normal_distribution<float> z(0.0f, 3.0f);
  for (const int64_t vp : {int64_t(50304), vocab})
    for (const DType dtype : {DType::fp32, DType::bf16}) {
      SCOPED_TRACE(std::string(to_string(dtype)) + " vp=" + std::to_string(vp));
      std::vector<float> wide(n * vp);
      for (int64_t i = 0; i < n * vp; ++i) wide[size_t(i)] = i / vp == 1 ? float(i % vp) * 1e-3f : z(rng);
      std::vector<int32_t> targets = {7, 50256, 31000};
      int32_t count = int32_t(n);
      Buffer logits(dtype, {n, vp}), grad_cpu(dtype, {n, vp}), grad_dev(dtype, {n, vp});
      convert(logits.tensor(), host_tensor(wide.data(), {n * vp}).view({n, vp}));
      std::vector<float> stats(4 * n);  // losses and lse, the CPU's then the device's
      Tensor tt = host_tensor(targets.data(), {n}), tc = host_tensor(&count, {1});
      cross_entropy_forward(host_tensor(&stats[0], {n}), host_tensor(&stats[n], {n}), logits.tensor(), tt, vocab,
                            kIgnore);
      cross_entropy_backward(grad_cpu.tensor(), logits.tensor(), host_tensor(&stats[n], {n}), tt, vocab, kIgnore, 1.0f,
                             tc);
      Tensor dl = host_tensor(&stats[2 * n], {n}), ds = host_tensor(&stats[3 * n], {n}), tx = logits.tensor(),
             tg = grad_dev.tensor();
      on(Device::cuda, {&dl, &ds, &tx, &tt, &tg, &tc}, [&] {
        cross_entropy_forward(dl, ds, tx, tt, vocab, kIgnore);
        cross_entropy_backward(tg, tx, ds, tt, vocab, kIgnore, 1.0f, tc);
      });
      auto as_double = [](const float* p, int64_t k) { return std::vector<double>(p, p + k); };
      EXPECT_LE(rel_error(as_double(&stats[2 * n], n), as_double(&stats[0], n)), 1e-6);
      EXPECT_LE(rel_error(as_double(&stats[3 * n], n), as_double(&stats[n], n)), 1e-6);
      std::vector<float> gc(n * vp), gd(n * vp);
      convert(host_tensor(gc.data(), {n * vp}), grad_cpu.tensor().view({n * vp}));
      convert(host_tensor(gd.data(), {n * vp}), grad_dev.tensor().view({n * vp}));
      EXPECT_LE(rel_error(as_double(gd.data(), n * vp), as_double(gc.data(), n * vp)),
                dtype == DType::fp32 ? 1e-5 : 2e-3);
    }
}

}  // namespace llmtrain::kernels::test
