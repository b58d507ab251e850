// AdamW and the clipping pieces (kernels/cpu/adamw.cpp, kernels/cpu/l2norm.cpp): adamw_rows against
// a double implementation of torch.optim.AdamW's update over several steps, the sums of squares
// against double sums, and the CUDA kernels against the CPU's.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <tuple>

#include "kernels/adamw_math.h"
#include "kernels/backend_info.h"
#include "kernels/buffer.h"
#include "kernels/dtype_convert.h"
#include "kernels/ops.h"
#include "op_harness.h"

namespace llmtrain::kernels::test {

// A table for adamw_rows over [0, n): rows of at most kSquaresChunk, state and rounded parameters at
// the parameters' offsets; [0, split) takes weight decay, [split, n) none.
std::vector<int64_t> adamw_table(int64_t n, int64_t split) {
  std::vector<int64_t> out;
  for (auto [b, e, decay] : {std::tuple{int64_t(0), split, 1}, std::tuple{split, n, 0}})
    for (int64_t at = b; at < e; at += kSquaresChunk)
      out.insert(out.end(), {at, at, at, at, std::min(kSquaresChunk, e - at), int64_t(decay)});
  return out;
}
Tensor table_tensor(std::vector<int64_t>& rows) {
  return Tensor(rows.data(), DType::int64, {int64_t(rows.size()) / 6, 6});
}

// Five steps of adamw_rows against a double implementation of torch.optim.AdamW's update, with
// weight decay on [0, split) only; with 16-bit gradients (read as stored) the reference takes the
// same rounded gradients, and the rounded parameters are the fp32 result rounded once.
TEST(AdamW, StepsMatchDoubleReference) {
  std::mt19937_64 rng(1201);
  std::normal_distribution<float> normal;
  const int64_t n = 100003, split = 30011;  // odd, above the parallel threshold
  std::vector<int64_t> rows = adamw_table(n, split);
  for (const DType gdt : {DType::fp32, DType::bf16, DType::fp16}) {
    SCOPED_TRACE(to_string(gdt));
    std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f), g(n);
    for (auto& x : p) x = normal(rng);
    std::vector<double> rp(p.begin(), p.end()), rm(n, 0.0), rv(n, 0.0);
    const double lr = 3e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, gs = 0.37;
    const DType rounded_dtype = gdt == DType::fp32 ? DType::bf16 : gdt;
    Buffer rounded(rounded_dtype, {n});
    for (int64_t step = 1; step <= 5; ++step) {
      for (auto& x : g) x = normal(rng);
      Buffer gs_stored(gdt, {n});
      convert(gs_stored.tensor(), host_tensor(g.data(), {n}));
      convert(host_tensor(g.data(), {n}), gs_stored.tensor());  // the reference reads what is stored
      const AdamWStep s{.lr = float(lr),
                        .beta1 = float(b1),
                        .beta2 = float(b2),
                        .eps = float(eps),
                        .weight_decay = float(wd),
                        .step = step,
                        .grad_scale = float(gs)};
      adamw_rows(host_tensor(p.data(), {n}), gs_stored.tensor(), host_tensor(m.data(), {n}), host_tensor(v.data(), {n}),
                 rounded.tensor(), table_tensor(rows), s);
      for (int64_t i = 0; i < n; ++i) {
        const double gi = double(g[i]) * gs;
        if (i < split) rp[i] *= 1 - lr * wd;
        rm[i] = b1 * rm[i] + (1 - b1) * gi;
        rv[i] = b2 * rv[i] + (1 - b2) * gi * gi;
        const double bc1 = 1 - std::pow(b1, double(step)), bc2 = 1 - std::pow(b2, double(step));
        rp[i] -= lr / bc1 * rm[i] / (std::sqrt(rv[i]) / std::sqrt(bc2) + eps);
      }
    }
    EXPECT_LE(rel_error(std::vector<double>(p.begin(), p.end()), rp), 1e-6);
    EXPECT_LE(rel_error(std::vector<double>(m.begin(), m.end()), rm), 1e-6);
    EXPECT_LE(rel_error(std::vector<double>(v.begin(), v.end()), rv), 1e-6);
    Buffer want(rounded_dtype, {n});
    convert(want.tensor(), host_tensor(p.data(), {n}));
    EXPECT_EQ(std::memcmp(rounded.data(), want.data(), size_t(n) * 2), 0) << "the result rounded once";
  }
}

// optimizer.state_dtype bf16: moments stored in bf16 are the fp32 update's moments rounded to
// nearest even after every step, bitwise, and the parameters follow from those rounded moments —
// on the CPU, and on the (simulated) device, whose update is the same function.
TEST(AdamW, Bf16MomentsAreTheFp32UpdateRoundedEachStep) {
  std::mt19937_64 rng(1207);
  std::normal_distribution<float> normal;
  const int64_t n = 70001, split = 20011;
  std::vector<int64_t> rows = adamw_table(n, split);
  std::vector<float> p(n), g(n), rm(n, 0.0f), rv(n, 0.0f);
  for (auto& x : p) x = normal(rng);
  std::vector<float> rp = p;
  Buffer m(DType::bf16, {n}), v(DType::bf16, {n});
  fill_zero(m.tensor());
  fill_zero(v.tensor());
  const bool on_cuda = [] {
    const CudaInfo c = cuda_info();
    return c.built && !c.devices.empty();
  }();
  Buffer dp, dm, dv, drows;
  if (on_cuda) {
    dp = Buffer(DType::fp32, {n}, Device::cuda), dm = Buffer(DType::bf16, {n}, Device::cuda);
    dv = Buffer(DType::bf16, {n}, Device::cuda), drows = Buffer(DType::int64, table_tensor(rows).shape, Device::cuda);
    copy(dp.tensor(), host_tensor(p.data(), {n}));
    fill_zero(dm.tensor());
    fill_zero(dv.tensor());
    copy(drows.tensor(), table_tensor(rows));
  }
  auto round_bf16 = [&](std::vector<float>& x) {
    Buffer b(DType::bf16, {n});
    convert(b.tensor(), host_tensor(x.data(), {n}));
    convert(host_tensor(x.data(), {n}), b.tensor());
  };
  for (int64_t step = 1; step <= 4; ++step) {
    for (auto& x : g) x = normal(rng);
    const AdamWStep s{.lr = 3e-3f, .weight_decay = 0.1f, .step = step, .grad_scale = 0.37f};
    adamw_rows(host_tensor(p.data(), {n}), host_tensor(g.data(), {n}), m.tensor(), v.tensor(), Tensor{},
               table_tensor(rows), s);
    adamw_rows(host_tensor(rp.data(), {n}), host_tensor(g.data(), {n}), host_tensor(rm.data(), {n}),
               host_tensor(rv.data(), {n}), Tensor{}, table_tensor(rows), s);
    round_bf16(rm);
    round_bf16(rv);
    if (on_cuda) {
      Buffer dg(DType::fp32, {n}, Device::cuda);
      copy(dg.tensor(), host_tensor(g.data(), {n}));
      adamw_rows(dp.tensor(), dg.tensor(), dm.tensor(), dv.tensor(), Tensor{}, drows.tensor(), s);
    }
  }
  std::vector<float> gm(n), gv(n);
  convert(host_tensor(gm.data(), {n}), m.tensor());
  convert(host_tensor(gv.data(), {n}), v.tensor());
  EXPECT_EQ(gm, rm);
  EXPECT_EQ(gv, rv);
  EXPECT_EQ(p, rp);
  if (!on_cuda) return;
  // The device against the CPU, as OnTheCudaDeviceMatchesTheCpu compares fp32 moments.
  std::vector<float> cp(n), cm(n), cv(n);
  Buffer hm(DType::bf16, {n}), hv(DType::bf16, {n});
  copy(host_tensor(cp.data(), {n}), dp.tensor());
  copy(hm.tensor(), dm.tensor());
  copy(hv.tensor(), dv.tensor());
  convert(host_tensor(cm.data(), {n}), hm.tensor());
  convert(host_tensor(cv.data(), {n}), hv.tensor());
  auto wide = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
  EXPECT_LE(rel_error(wide(cp), wide(p)), 1e-5);
  EXPECT_LE(rel_error(wide(cm), wide(gm)), 1e-5);
  EXPECT_LE(rel_error(wide(cv), wide(gv)), 1e-5);
}

// optimizer.master false: bf16 parameters updated in place, rounded stochastically. Each result is
// one of the two bf16 neighbours of the fp32 update computed from the widened parameter; an update
// of a fifth of an ulp, which rounding to nearest would drop, moves the mean as the fp32 update
// does; the bits depend on the key (seed and step) and the element only, so a rerun is bitwise the
// same and another seed differs; the (simulated) device rounds as the CPU does.
TEST(AdamW, Bf16ParamsWithoutMasterRoundStochastically) {
  const int64_t n = 65537, split = 20011;
  std::vector<int64_t> rows = adamw_table(n, split);
  auto bf16_of = [](const std::vector<float>& x) {
    std::vector<uint16_t> out(x.size());
    convert(Tensor(out.data(), DType::bf16, {int64_t(x.size())}),
            host_tensor(const_cast<float*>(x.data()), {int64_t(x.size())}));
    return out;
  };
  auto widen = [](const std::vector<uint16_t>& x) {
    std::vector<float> out(x.size());
    convert(host_tensor(out.data(), {int64_t(x.size())}),
            Tensor(const_cast<uint16_t*>(x.data()), DType::bf16, {int64_t(x.size())}));
    return out;
  };
  // Steps 1..steps on bf16 parameters p (and fp32 moments) with gradients g, under seed `seed`.
  auto run = [&](std::vector<uint16_t> p, const std::vector<float>& g, float lr, uint64_t seed, int64_t steps) {
    std::vector<float> m(size_t(n), 0.0f), v(size_t(n), 0.0f);
    for (int64_t step = 1; step <= steps; ++step) {
      const AdamWStep s{.lr = lr, .weight_decay = 0.1f, .step = step, .rounding_key = rounding_key(seed, step)};
      adamw_rows(Tensor(p.data(), DType::bf16, {n}), host_tensor(const_cast<float*>(g.data()), {n}),
                 host_tensor(m.data(), {n}), host_tensor(v.data(), {n}), Tensor{}, table_tensor(rows), s);
    }
    return p;
  };
  std::mt19937_64 rng(1211);
  std::normal_distribution<float> normal;
  std::vector<float> g(static_cast<size_t>(n)), x(static_cast<size_t>(n));
  for (auto& e : g) e = normal(rng);
  for (auto& e : x) e = normal(rng);
  const std::vector<uint16_t> p0 = bf16_of(x);

  // One step: each result a neighbour of the fp32 update of the widened value.
  const std::vector<uint16_t> p1 = run(p0, g, 3e-3f, 7, 1);
  std::vector<float> want = widen(p0), m(static_cast<size_t>(n), 0.0f), v(static_cast<size_t>(n), 0.0f);
  adamw_rows(host_tensor(want.data(), {n}), host_tensor(g.data(), {n}), host_tensor(m.data(), {n}),
             host_tensor(v.data(), {n}), Tensor{}, table_tensor(rows),
             AdamWStep{.lr = 3e-3f, .weight_decay = 0.1f, .step = 1});
  const std::vector<float> got = widen(p1);
  int64_t up = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t toward_zero = uint16_t(std::bit_cast<uint32_t>(want[i]) >> 16);
    const float lo = bf16_to_fp32(toward_zero), hi = bf16_to_fp32(uint16_t(toward_zero + 1));
    ASSERT_TRUE(got[i] == lo || got[i] == hi) << i << ": " << got[i] << " for " << want[i];
    up += got[i] != lo;
  }
  EXPECT_GT(up, n / 4) << "rounded away from zero about half the time";
  EXPECT_LT(up, 3 * n / 4);

  // A fifth of an ulp a step below 1.0 (ulp 2^-8 there): nearest rounding keeps 1.0 for ever; the
  // stochastic mean follows the fp32 parameter within 5 standard errors (each step's rounding adds
  // a variance of at most ulp²/4).
  const int64_t steps = 5;
  const float small_lr = 0.2f / 256;
  const std::vector<float> ones(size_t(n), 1.0f), unit(size_t(n), 1.0f);
  const std::vector<float> moved = widen(run(bf16_of(ones), unit, small_lr, 11, steps));
  std::vector<float> fp32 = ones;
  std::fill(m.begin(), m.end(), 0.0f);
  std::fill(v.begin(), v.end(), 0.0f);
  for (int64_t step = 1; step <= steps; ++step)
    adamw_rows(host_tensor(fp32.data(), {n}), host_tensor(const_cast<float*>(unit.data()), {n}),
               host_tensor(m.data(), {n}), host_tensor(v.data(), {n}), Tensor{}, table_tensor(rows),
               AdamWStep{.lr = small_lr, .weight_decay = 0.1f, .step = step});
  for (const auto& [b, e] : {std::pair{int64_t(0), split}, std::pair{split, n}}) {  // with and without decay
    double mean = 0, target = 0;
    for (int64_t i = b; i < e; ++i) mean += moved[i], target += fp32[i];
    mean /= double(e - b), target /= double(e - b);
    EXPECT_GT(1.0 - target, 0.0035) << "the fp32 parameter moved about one bf16 ulp";
    EXPECT_NEAR(mean, target, 5 * std::sqrt(double(steps)) * (1.0 / 256) * 0.5 / std::sqrt(double(e - b)))
        << "[" << b << ", " << e << ")";
  }

  // Bits by key and element: the same run again, then another seed.
  EXPECT_EQ(run(p0, g, 3e-3f, 7, 3), run(p0, g, 3e-3f, 7, 3));
  const std::vector<uint16_t> a = run(p0, g, 3e-3f, 7, 3), c = run(p0, g, 3e-3f, 8, 3);
  EXPECT_GT(std::inner_product(a.begin(), a.end(), c.begin(), int64_t(0), std::plus<>(), std::not_equal_to<>()),
            n / 10);

  const CudaInfo info = cuda_info();
  if (!info.built || info.devices.empty()) return;
  // The device: the same key and table, the CPU's bits.
  Buffer dp(DType::bf16, {n}, Device::cuda), dg(DType::fp32, {n}, Device::cuda), dm(DType::fp32, {n}, Device::cuda),
      dv(DType::fp32, {n}, Device::cuda), drows(DType::int64, table_tensor(rows).shape, Device::cuda);
  copy(dp.tensor(), Tensor(const_cast<uint16_t*>(p0.data()), DType::bf16, {n}));
  copy(dg.tensor(), host_tensor(g.data(), {n}));
  fill_zero(dm.tensor());
  fill_zero(dv.tensor());
  copy(drows.tensor(), table_tensor(rows));
  for (int64_t step = 1; step <= 3; ++step)
    adamw_rows(dp.tensor(), dg.tensor(), dm.tensor(), dv.tensor(), Tensor{}, drows.tensor(),
               AdamWStep{.lr = 3e-3f, .weight_decay = 0.1f, .step = step, .rounding_key = rounding_key(7, step)});
  std::vector<uint16_t> device(static_cast<size_t>(n));
  copy(Tensor(device.data(), DType::bf16, {n}), dp.tensor());
  EXPECT_EQ(device, a);
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
  std::vector<int64_t> rows = adamw_table(n, n / 2);
  Buffer drows(DType::int64, table_tensor(rows).shape, Device::cuda);
  copy(drows.tensor(), table_tensor(rows));
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
      adamw_rows(host_tensor(p.data(), {n}), hg.tensor(), host_tensor(m.data(), {n}), host_tensor(v.data(), {n}),
                 Tensor{}, table_tensor(rows), s);
      adamw_rows(dp.tensor(), dg.tensor(), dm.tensor(), dv.tensor(), Tensor{}, drows.tensor(), s);
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

// sum_squares_chunks over segments cut at sum_squares' chunks is sum_squares of each segment,
// bitwise on the CPU; then both table ops on the simulated device against the CPU's (their launch
// counts: tests/trainer/loop/test_step_sync_sim.cpp).
// Segments [0, 5), [5, 40000), [40000, 40000) (empty), [40007, n) of n random values, cut at
// sum_squares' chunks, and their sums by sum_squares_chunks on the CPU.
struct Segments {
  int64_t n = 100003;
  std::vector<float> x;
  std::vector<std::pair<int64_t, int64_t>> bounds{{0, 5}, {5, 40000}, {40000, 40000}, {40007, 100003}};
  std::vector<int64_t> chunks, first{0};
  std::vector<float> out;
  Segments() {
    std::mt19937_64 rng(1205);
    std::normal_distribution<float> normal;
    x.resize(size_t(n));
    for (auto& e : x) e = normal(rng);
    for (auto [b, e] : bounds) {
      for (int64_t at = b; at < e; at += kSquaresChunk)
        chunks.insert(chunks.end(), {at, std::min(kSquaresChunk, e - at)});
      first.push_back(int64_t(chunks.size()) / 2);
    }
    out.resize(bounds.size());
    sum_squares_chunks(host_tensor(out.data(), {int64_t(out.size())}), host_tensor(x.data(), {n}), table(), starts());
  }
  Tensor table() { return Tensor(chunks.data(), DType::int64, {int64_t(chunks.size()) / 2, 2}); }
  Tensor starts() { return Tensor(first.data(), DType::int64, {int64_t(first.size())}); }
};

TEST(AdamW, SumSquaresChunksAreEachSegmentsSum) {
  Segments g;
  for (size_t j = 0; j < g.bounds.size(); ++j) {
    const auto [b, e] = g.bounds[j];
    EXPECT_EQ(g.out[j], host_sum_squares(host_tensor(g.x.data() + b, {e - b}))) << j;
  }
}

TEST(AdamW, MultiTensorOpsOnTheCudaDeviceMatchTheCpu) {
  const CudaInfo cuda = cuda_info();
  if (!cuda.built || cuda.devices.empty()) GTEST_SKIP() << "no CUDA device (build with -DLLMTRAIN_CUDA=SIM)";
  auto to_device = [](const void* h, DType dtype, Shape shape) {
    Buffer d(dtype, shape, Device::cuda);
    copy(d.tensor(), Tensor(const_cast<void*>(h), dtype, shape));
    return d;
  };
  Segments sg;
  Buffer dx = to_device(sg.x.data(), DType::fp32, {sg.n});
  Buffer dtable = to_device(sg.chunks.data(), DType::int64, sg.table().shape);
  Buffer dfirst = to_device(sg.first.data(), DType::int64, sg.starts().shape);
  Buffer dout(DType::fp32, {int64_t(sg.out.size())}, Device::cuda);
  sum_squares_chunks(dout.tensor(), dx.tensor(), dtable.tensor(), dfirst.tensor());
  std::vector<float> got(sg.out.size());
  copy(host_tensor(got.data(), {int64_t(got.size())}), dout.tensor());
  for (size_t j = 0; j < sg.out.size(); ++j) EXPECT_NEAR(got[j], sg.out[j], 1e-5 * sg.out[j]) << j;
  std::mt19937_64 rng(1206);
  std::normal_distribution<float> normal;

  // adamw_rows on the device, fp32 gradients and bf16 rounded parameters, against the CPU.
  struct {
    int64_t n = 70001;
  } c;
  std::vector<float> p(c.n), m(c.n, 0.0f), v(c.n, 0.0f), g(c.n);
  for (auto& e : p) e = normal(rng);
  for (auto& e : g) e = normal(rng);
  std::vector<int64_t> rows = adamw_table(c.n, 30011);
  const Shape rows_shape{int64_t(rows.size()) / 6, 6};
  Buffer dp = to_device(p.data(), DType::fp32, {c.n}), dg = to_device(g.data(), DType::fp32, {c.n});
  Buffer dm = to_device(m.data(), DType::fp32, {c.n}), dv = to_device(v.data(), DType::fp32, {c.n});
  Buffer drows = to_device(rows.data(), DType::int64, rows_shape), dr(DType::bf16, {c.n}, Device::cuda);
  Buffer hr(DType::bf16, {c.n});
  const AdamWStep s{.lr = 3e-3f, .weight_decay = 0.1f, .step = 1, .grad_scale = 0.37f};
  adamw_rows(dp.tensor(), dg.tensor(), dm.tensor(), dv.tensor(), dr.tensor(), drows.tensor(), s);
  adamw_rows(host_tensor(p.data(), {c.n}), host_tensor(g.data(), {c.n}), host_tensor(m.data(), {c.n}),
             host_tensor(v.data(), {c.n}), hr.tensor(), Tensor(rows.data(), DType::int64, rows_shape), s);
  std::vector<float> back(c.n);
  copy(host_tensor(back.data(), {c.n}), dp.tensor());
  EXPECT_LE(rel_error(std::vector<double>(back.begin(), back.end()), std::vector<double>(p.begin(), p.end())), 1e-6);
  Buffer rback(DType::bf16, {c.n});
  copy(rback.tensor(), dr.tensor());
  std::vector<float> a(c.n), b(c.n);
  convert(host_tensor(a.data(), {c.n}), rback.tensor());
  convert(host_tensor(b.data(), {c.n}), hr.tensor());
  EXPECT_LE(rel_error(std::vector<double>(a.begin(), a.end()), std::vector<double>(b.begin(), b.end())), 1e-2);
}

}  // namespace llmtrain::kernels::test

namespace llmtrain::kernels::test {

// adamw_rows on the device takes groups of 4 elements per access where a row's arrays are aligned
// alike and goes element by element where they are not: every path gives each element the CPU's
// update. Rows: a whole chunk at offset 0; a head of 3 before the groups (offsets ≡ 1 mod 4); the
// gradient, state and rounded offsets at different residues (scalar); a row shorter than its head;
// only the rounded parameters misaligned. bf16 gradients and rounded parameters (8-byte groups).
// Bitwise, on a GPU too: both devices call kernels/adamw_math.h, whose every operation is
// correctly rounded.
TEST(AdamW, RowsOfEveryAlignmentMatchTheCpu) {
  const CudaInfo cuda = cuda_info();
  if (!cuda.built || cuda.devices.empty()) GTEST_SKIP() << "no CUDA device (build with -DLLMTRAIN_CUDA=SIM)";
  const int64_t n = 50000;
  std::vector<int64_t> rows = {0,     0,     0,     0,     kSquaresChunk,
                               1,  //
                               16385, 16385, 16385, 16385, 1000,
                               0,  //
                               20000, 20001, 20002, 20003, 999,
                               1,  //
                               30001, 30001, 30001, 30001, 3,
                               1,  //
                               40000, 40000, 40000, 40002, 7001,
                               1};
  std::mt19937_64 rng(1207);
  std::normal_distribution<float> normal;
  std::vector<float> p(n), m(n), v(n), gw(n);
  for (auto& e : p) e = normal(rng);
  for (auto& e : m) e = 0.1f * normal(rng);
  for (auto& e : v) e = std::abs(0.01f * normal(rng));
  for (auto& e : gw) e = normal(rng);
  Buffer g(DType::bf16, {n}), r(DType::bf16, {n});
  convert(g.tensor(), host_tensor(gw.data(), {n}));
  convert(r.tensor(), host_tensor(p.data(), {n}));
  auto to_device = [](Tensor h) {
    Buffer d(h.dtype, h.shape, Device::cuda);
    copy(d.tensor(), h);
    return d;
  };
  Buffer dp = to_device(host_tensor(p.data(), {n})), dm = to_device(host_tensor(m.data(), {n}));
  Buffer dv = to_device(host_tensor(v.data(), {n})), dg = to_device(g.tensor()), dr = to_device(r.tensor());
  Buffer drows = to_device(table_tensor(rows));
  for (int64_t step = 1; step <= 2; ++step) {
    const AdamWStep s{.lr = 3e-3f, .weight_decay = 0.1f, .step = step, .grad_scale = 0.37f};
    adamw_rows(host_tensor(p.data(), {n}), g.tensor(), host_tensor(m.data(), {n}), host_tensor(v.data(), {n}),
               r.tensor(), table_tensor(rows), s);
    adamw_rows(dp.tensor(), dg.tensor(), dm.tensor(), dv.tensor(), dr.tensor(), drows.tensor(), s);
  }
  auto back = [](const Buffer& d) {
    Buffer h(d.dtype(), d.tensor().shape);
    copy(h.tensor(), d.tensor());
    std::vector<float> out(size_t(d.tensor().numel()));
    convert(host_tensor(out.data(), {int64_t(out.size())}), h.tensor());
    return out;
  };
  std::vector<float> rw(n);
  convert(host_tensor(rw.data(), {n}), r.tensor());
  const std::vector<std::pair<const char*, std::pair<std::vector<float>, std::vector<float>>>> checks = {
      {"params", {back(dp), p}}, {"m", {back(dm), m}}, {"v", {back(dv), v}}, {"rounded", {back(dr), rw}}};
  for (const auto& [name, got_want] : checks) {
    const auto& [got, want] = got_want;
    int64_t differ = 0, first = -1;
    for (size_t i = 0; i < got.size(); ++i)
      if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && differ++ == 0) first = int64_t(i);
    EXPECT_EQ(differ, 0) << name << ": first at " << first;
  }
}

// The gradient norm's parts are the same bits every run: sum_squares_chunks twice on the device
// (fixed chunk order, fixed tree in each chunk, no atomics).
TEST(AdamW, SumSquaresChunksOnTheDeviceAreReproducible) {
  const CudaInfo cuda = cuda_info();
  if (!cuda.built || cuda.devices.empty()) GTEST_SKIP() << "no CUDA device (build with -DLLMTRAIN_CUDA=SIM)";
  Segments sg;
  Buffer x(DType::bf16, {sg.n});
  convert(x.tensor(), host_tensor(sg.x.data(), {sg.n}));
  Buffer dx(DType::bf16, {sg.n}, Device::cuda), dtable(DType::int64, sg.table().shape, Device::cuda),
      dfirst(DType::int64, sg.starts().shape, Device::cuda),
      dout(DType::fp32, {2, int64_t(sg.out.size())}, Device::cuda);
  copy(dx.tensor(), x.tensor());
  copy(dtable.tensor(), sg.table());
  copy(dfirst.tensor(), sg.starts());
  const int64_t k = int64_t(sg.out.size());
  for (int run = 0; run < 2; ++run)
    sum_squares_chunks(dout.tensor().flat(run * k, k), dx.tensor(), dtable.tensor(), dfirst.tensor());
  std::vector<float> got(size_t(2 * k)), cpu(static_cast<size_t>(k));
  copy(host_tensor(got.data(), {2 * k}), dout.tensor().view({2 * k}));
  sum_squares_chunks(host_tensor(cpu.data(), {k}), x.tensor(), sg.table(), sg.starts());
  for (int64_t j = 0; j < k; ++j) {
    EXPECT_EQ(got[size_t(j)], got[size_t(k + j)]) << j;
    EXPECT_NEAR(got[size_t(j)], cpu[size_t(j)], 1e-5 * cpu[size_t(j)]) << j;
  }
}

}  // namespace llmtrain::kernels::test
