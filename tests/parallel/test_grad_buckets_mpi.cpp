// The data-parallel gradient reducer under mpirun: for random parameter lists, bucket sizes
// (including buckets smaller than one parameter) and a different order of mark_ready() on every
// rank, the gradients end as the average over ranks (and the reduced hook reports each bucket once,
// in order, holding its average) — checked against a naive double-precision
// average, against Comm::all_reduce(avg) of the same ranges (bitwise), and bitwise equal on every
// rank. Memory between parameters is never touched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "common/error.h"
#include "parallel/grad_buckets.h"
#include "tests/parallel/mpi_test_env.h"

namespace llmtrain::parallel {
namespace {

using kernels::host_tensor;

using mpitest::unit_float;
using mpitest::world;

struct Layout {
  std::vector<ParamRange> params;  // forward order
  int64_t total = 0;
};

// Parameters laid out in forward order; with `gaps`, unused elements sit between some of them.
Layout random_layout(std::mt19937_64& rng, bool gaps) {
  Layout l;
  const int n = std::uniform_int_distribution<int>(1, 40)(rng);
  for (int i = 0; i < n; ++i) {
    int64_t size = std::uniform_int_distribution<int64_t>(0, 5000)(rng);
    if (rng() % 8 == 0) size = std::uniform_int_distribution<int64_t>(40000, 120000)(rng);  // a large matrix
    if (gaps && rng() % 3 == 0) l.total += std::uniform_int_distribution<int64_t>(1, 17)(rng);
    l.params.push_back({l.total, size});
    l.total += size;
  }
  return l;
}

void run_trial(uint64_t seed, double bucket_mb, bool gaps, bool mark_some) {
  MpiComm& c = world();
  std::mt19937_64 shared(seed);  // the same on every rank: layout and bucket size
  Layout l = random_layout(shared, gaps);
  SCOPED_TRACE(fmt::format("seed {} bucket_mb {} params {} elements {}", seed, bucket_mb, l.params.size(), l.total));
  std::vector<float> grads(l.total);
  std::vector<char> in_param(l.total, 0);
  for (const auto& p : l.params) std::fill_n(in_param.begin() + p.offset, p.numel, 1);

  GradBuckets gb(c, host_tensor(grads.data(), {l.total}), l.params, bucket_mb);
  // The reduced hook: every non-empty bucket once, in bucket order, already holding its average.
  struct Report {
    int64_t offset, numel;
    std::vector<float> values;
  };
  std::vector<Report> reports;
  gb.set_reduced_hook([&](int64_t offset, int64_t numel) {
    reports.push_back({offset, numel, std::vector<float>(grads.begin() + offset, grads.begin() + offset + numel)});
  });

  // Buckets: contiguous, in backward order, covering every parameter once, at most one param
  // over the cap.
  std::vector<int> seen(l.params.size(), 0);
  int64_t prev_offset = l.total + 1;
  for (const auto& b : gb.buckets()) {
    EXPECT_LT(b.offset, prev_offset);
    prev_offset = b.offset;
    int64_t sum = 0;
    for (size_t k = 0; k < b.params.size(); ++k) {
      int p = b.params[k];
      seen[p]++;
      sum += l.params[p].numel;
      if (k > 0) {
        EXPECT_EQ(p, b.params[k - 1] - 1) << "bucket params must be consecutive, backward";
      }
    }
    EXPECT_EQ(sum, b.numel);
  }
  for (int s : seen) EXPECT_EQ(s, 1);

  std::mt19937_64 mine(seed * 7919 + c.rank());  // each rank's own ready order
  for (int step = 0; step < 2; ++step) {
    const uint64_t data_seed = seed * 100 + step;
    for (int64_t i = 0; i < l.total; ++i) grads[i] = in_param[i] ? unit_float(data_seed, c.rank(), i) : -7.0f;
    std::vector<float> before = grads;

    std::vector<int> order(l.params.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(order.size() - 1 - i);  // backward
    if (step == 1 || c.rank() % 2 == 1) std::shuffle(order.begin(), order.end(), mine);
    if (mark_some) order.resize(order.size() / 2);  // finish() marks the rest
    reports.clear();
    for (int p : order) gb.mark_ready(p);
    gb.finish();
    // Every parameter element reported once (one rank: parameter by parameter; else bucket by
    // bucket, in bucket order), holding its average when it was.
    std::vector<int> times(size_t(l.total), 0);
    for (const Report& r : reports) {
      for (int64_t i = r.offset; i < r.offset + r.numel; ++i) ++times[size_t(i)];
      EXPECT_EQ(std::memcmp(r.values.data(), grads.data() + r.offset, size_t(r.numel) * sizeof(float)), 0)
          << "range at " << r.offset << " reported before its average was in place";
    }
    for (int64_t i = 0; i < l.total; ++i) EXPECT_EQ(times[size_t(i)], in_param[size_t(i)] ? 1 : 0) << "element " << i;
    if (c.size() > 1) {
      size_t next = 0;
      for (const auto& b : gb.buckets())
        if (b.numel > 0 && next < reports.size()) {
          EXPECT_EQ(reports[next].offset, b.offset);
          EXPECT_EQ(reports[next++].numel, b.numel);
        }
      EXPECT_EQ(next, reports.size());
    }

    // Naive average in double.
    double num = 0, den = 0;
    for (int64_t i = 0; i < l.total; ++i) {
      if (!in_param[i]) {
        EXPECT_EQ(grads[i], -7.0f) << "element " << i << " between parameters was written";
        continue;
      }
      double want = 0;
      for (int r = 0; r < c.size(); ++r) want += unit_float(data_seed, r, i);
      want /= c.size();
      num += (grads[i] - want) * (grads[i] - want);
      den += want * want;
    }
    if (den > 0) {
      EXPECT_LE(std::sqrt(num / den), 1e-6);
    }

    // The same as all_reduce(avg) of each bucket's range.
    for (const auto& b : gb.buckets()) c.all_reduce(host_tensor(before.data() + b.offset, {b.numel}), ReduceOp::avg);
    int64_t differ = 0;
    for (int64_t i = 0; i < l.total; ++i) differ += std::memcmp(&before[i], &grads[i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0) << "elements differing from all_reduce(avg) of the buckets";

    // Bitwise equal on every rank: compare with rank 0's copy.
    std::vector<float> root = grads;
    c.broadcast(host_tensor(root.data(), {l.total}), 0);
    EXPECT_EQ(std::memcmp(root.data(), grads.data(), grads.size() * sizeof(float)), 0)
        << "rank " << c.rank() << " differs from rank 0";
  }
  const GradBucketStats& s = gb.stats();
  EXPECT_EQ(s.steps, 2);
  int nonempty = 0;
  for (const auto& b : gb.buckets()) nonempty += b.numel > 0;
  EXPECT_EQ(s.buckets, 2 * nonempty);
  EXPECT_GE(s.exposed_s, 0);
  EXPECT_LE(s.exposed_s, s.span_s);
}

TEST(GradBucketsMpi, AverageEqualsAllReduceForRandomLayoutsAndReadyOrders) {
  uint64_t seed = 1;
  for (double mb : {1e-6, 0.004, 0.05, 25.0})  // 1e-6 MiB: every bucket smaller than one parameter
    for (bool gaps : {false, true}) run_trial(seed++, mb, gaps, false);
  run_trial(seed++, 0.01, false, true);
  run_trial(seed++, 0.01, true, true);
}

TEST(GradBucketsMpi, Bf16GradientsAverageInFp32AndRoundOnce) {
  MpiComm& c = world();
  const int64_t n = 3001;
  std::vector<uint16_t> g(n);
  // Values k * size with small k: exact in bf16, and so is their average.
  auto val = [&](int r, int64_t i) { return float(mpitest::small_int(77, r, i, -20, 20) * c.size()); };
  for (int64_t i = 0; i < n; ++i) g[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(val(c.rank(), i)) >> 16);
  GradBuckets gb(c, Tensor(g.data(), kernels::DType::bf16, {n}), {{0, 1000}, {1000, 1000}, {2000, 1001}}, 0.001);
  EXPECT_EQ(gb.buckets().size(), 3u);
  gb.mark_ready(1);
  gb.mark_ready(2);
  gb.mark_ready(0);
  gb.finish();
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    float want = 0;
    for (int r = 0; r < c.size(); ++r) want += val(r, i);
    want /= c.size();
    bad += std::bit_cast<float>(uint32_t(g[i]) << 16) != want;
  }
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace llmtrain::parallel
