// Bucket formation (pure arithmetic over parameter ranges) and the one-rank reducer, which must
// leave gradients exactly as they were. The multi-rank reduction: test_grad_buckets_mpi.cpp.
#include <gtest/gtest.h>

#include "parallel/grad_buckets.h"

namespace llmtrain::parallel {
namespace {

using kernels::host_tensor;

std::vector<std::vector<int>> bucket_params(const GradBuckets& gb) {
  std::vector<std::vector<int>> out;
  for (const auto& b : gb.buckets()) out.push_back(b.params);
  return out;
}

TEST(GradBuckets, BucketsFollowBackwardOrderAndCloseOnceFull) {
  // 4 parameters of 1 MiB of fp32 each, forward order, contiguous; 2 MiB buckets.
  const int64_t m = 262144;
  std::vector<float> g(4 * m);
  auto comm = make_local_comm("dp");
  GradBuckets gb(*comm, host_tensor(g.data(), {4 * m}), {{0, m}, {m, m}, {2 * m, m}, {3 * m, m}}, 2.0);
  EXPECT_EQ(bucket_params(gb), (std::vector<std::vector<int>>{{3, 2}, {1, 0}}));
  EXPECT_EQ(gb.buckets()[0].offset, 2 * m);
  EXPECT_EQ(gb.buckets()[0].numel, 2 * m);
  EXPECT_EQ(gb.buckets()[1].offset, 0);
}

TEST(GradBuckets, AParameterLargerThanTheCapIsABucketOfItsOwn) {
  std::vector<float> g(1000);
  auto comm = make_local_comm("dp");
  // 1e-6 MiB is ~1 byte: smaller than every parameter. An empty parameter fills nothing, so the
  // bucket it starts takes the next one too.
  GradBuckets gb(*comm, host_tensor(g.data(), {1000}), {{0, 100}, {100, 0}, {100, 900}}, 1e-6);
  EXPECT_EQ(bucket_params(gb), (std::vector<std::vector<int>>{{2}, {1, 0}}));
}

TEST(GradBuckets, ParametersThatAreNotAdjacentStartANewBucket) {
  std::vector<float> g(100);
  auto comm = make_local_comm("dp");
  GradBuckets gb(*comm, host_tensor(g.data(), {100}), {{0, 10}, {10, 10}, {30, 10}, {40, 10}}, 25.0);
  EXPECT_EQ(bucket_params(gb), (std::vector<std::vector<int>>{{3, 2}, {1, 0}}));
  EXPECT_EQ(gb.buckets()[0].offset, 30);
  EXPECT_EQ(gb.buckets()[0].numel, 20);
}

TEST(GradBuckets, OneRankLeavesGradientsUntouchedAndCountsSteps) {
  std::vector<float> g(50);
  for (int i = 0; i < 50; ++i) g[i] = 0.1f * i;
  const std::vector<float> before = g;
  auto comm = make_local_comm("dp");
  GradBuckets gb(*comm, host_tensor(g.data(), {50}), {{0, 20}, {20, 30}}, 1e-5);
  for (int step = 0; step < 3; ++step) {
    gb.mark_ready(1);
    if (step != 1) gb.mark_ready(0);  // finish() marks the rest
    gb.finish();
  }
  EXPECT_EQ(g, before);
  EXPECT_EQ(gb.stats().steps, 3);
  EXPECT_EQ(gb.stats().buckets, 0);  // nothing sent over one rank
}

TEST(GradBucketsDeathTest, MarkingAParameterTwiceInOneStepIsABug) {
  std::vector<float> g(10);
  auto comm = make_local_comm("dp");
  GradBuckets gb(*comm, host_tensor(g.data(), {10}), {{0, 10}}, 1.0);
  gb.mark_ready(0);
  EXPECT_DEATH(gb.mark_ready(0), "marked ready twice");
}

}  // namespace
}  // namespace llmtrain::parallel
