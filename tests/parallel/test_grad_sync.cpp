// The gradient-sync seam (parallel/grad_sync.h) on ranks as threads: stage 0 averages every
// gradient over the data-parallel group, whatever order groups complete in on each rank, owns the
// whole buffer, and ignores groups completed on micro-batches before the last (accumulation goes on
// in place). ZeRO stages are refused until they are built.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>

#include "parallel/comm_threads.h"
#include "parallel/grad_sync.h"

namespace llmtrain::parallel {
namespace {

using kernels::host_tensor;

// Four parameters of 5, 7, 3 and 11 elements in forward order; groups in backward order.
const std::vector<ParamRange> kRanges{{0, 5}, {5, 7}, {12, 3}, {15, 11}};
const std::vector<std::vector<int>> kGroups{{3}, {2, 1}, {0}};
constexpr int64_t kNumel = 26;

float grad_value(int rank, int64_t i) { return float(rank * 100 + i) * 0.25f; }

TEST(GradSync, StageZeroAveragesEveryGradientOverTheGroup) {
  for (int n : {1, 2, 3}) {
    SCOPED_TRACE(n);
    std::vector<std::vector<float>> results(static_cast<size_t>(n));
    run_ranks_in_threads(n, [&](Comm& dp) {
      std::vector<float> params(kNumel, 1.0f), grads(kNumel);
      for (int64_t i = 0; i < kNumel; ++i) grads[size_t(i)] = grad_value(dp.rank(), i);
      auto sync = make_grad_sync(
          0, dp, {host_tensor(params.data(), {kNumel}), host_tensor(grads.data(), {kNumel}), kRanges, kGroups},
          1e-5);  // buckets of ~10 bytes: several buckets
      EXPECT_EQ(sync->owned(), (FlatRange{0, kNumel}));
      EXPECT_FALSE(sync->shards_over_dp());
      // An earlier micro-batch's completions start nothing; the last one's do, in an order that
      // differs per rank (rank 1 forgets group 1: finish() takes it).
      for (int g = 0; g < 3; ++g) sync->group_ready(g, false);
      if (dp.rank() % 2 == 0) {
        for (int g : {0, 1, 2}) sync->group_ready(g, true);
      } else {
        for (int g : {2, 0}) sync->group_ready(g, true);
      }
      sync->finish();
      sync->gather_params();
      results[size_t(dp.rank())] = grads;
      EXPECT_EQ(params, std::vector<float>(kNumel, 1.0f));
    });
    for (int64_t i = 0; i < kNumel; ++i) {
      float sum = 0;
      for (int r = 0; r < n; ++r) sum += grad_value(r, i);
      for (int r = 0; r < n; ++r)
        EXPECT_EQ(results[size_t(r)][size_t(i)], sum / float(n)) << "rank " << r << " i " << i;
    }
  }
}

TEST(GradSync, ItRearmsForTheNextStep) {
  run_ranks_in_threads(2, [&](Comm& dp) {
    std::vector<float> params(kNumel), grads(kNumel);
    auto sync = make_grad_sync(
        0, dp, {host_tensor(params.data(), {kNumel}), host_tensor(grads.data(), {kNumel}), kRanges, kGroups}, 25.0);
    for (int step = 0; step < 3; ++step) {
      std::fill(grads.begin(), grads.end(), float(dp.rank() + step));
      for (int g = 0; g < 3; ++g) sync->group_ready(g, true);
      sync->finish();
      EXPECT_EQ(grads, std::vector<float>(kNumel, float(step) + 0.5f)) << "step " << step;
    }
  });
}

TEST(GradSync, ZeroStagesAreNotSupportedYet) {
  auto dp = make_local_comm("dp");
  std::vector<float> params(kNumel), grads(kNumel);
  for (int zero : {1, 2, 3}) {
    try {
      make_grad_sync(zero, *dp,
                     {host_tensor(params.data(), {kNumel}), host_tensor(grads.data(), {kNumel}), kRanges, kGroups},
                     25.0);
      ADD_FAILURE() << "zero " << zero << " accepted";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("not supported yet: parallel.zero"));
    }
  }
}

}  // namespace
}  // namespace llmtrain::parallel
