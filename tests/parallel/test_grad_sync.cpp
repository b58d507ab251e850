// The gradient-sync seam (parallel/grad_sync.h) on ranks as threads: stage 0 averages every
// gradient over the data-parallel group, whatever order groups complete in on each rank, owns the
// whole buffer, and ignores groups completed on micro-batches before the last (accumulation goes on
// in place). ZeRO stage 1 (and hybrid sharding) leaves on every rank the dp-average of the chunks
// it owns, owns every element exactly once per shard group (padding uneven groups), and gathers the
// updated chunks back into identical full buffers. Stage 2 hands out pooled storage per group,
// reduce-scatters every micro-batch and leaves the dp-average of the accumulated gradient in the
// compact owned shard, with no more slots than the pool has. Stage 3 also hands out every group's
// values gathered from the owned shards, in forward and backward order.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <mutex>
#include <numeric>
#include <thread>

#include "kernels/buffer.h"
#include "parallel/comm/comm_threads.h"
#include "parallel/grad_sync.h"

namespace llmtrain::parallel {
namespace {

using kernels::host_tensor;

// Four parameters of 5, 7, 3 and 11 elements in forward order; groups in backward order.
const std::vector<ParamRange> kRanges{{0, 5}, {5, 7}, {12, 3}, {15, 11}};
const std::vector<std::vector<int>> kGroups{{3}, {2, 1}, {0}};
constexpr int64_t kNumel = 26;

float grad_value(int rank, int64_t i) { return float(rank * 100 + i) * 0.25f; }

// Group g's values from group_params(g, backward): `scale` times each element's flat index.
void expect_gathered(GradSync& sync, int g, bool backward, float scale) {
  const Tensor v = sync.group_params(g, backward);
  int64_t begin = INT64_MAX;
  for (int p : kGroups[size_t(g)]) begin = std::min(begin, kRanges[size_t(p)].offset);
  for (int p : kGroups[size_t(g)])
    for (int64_t i = 0; i < kRanges[size_t(p)].numel; ++i) {
      const int64_t flat = kRanges[size_t(p)].offset + i;
      EXPECT_EQ(v.ptr<float>()[flat - begin], scale * float(flat)) << "group " << g << " element " << flat;
    }
}

TEST(GradSync, StageZeroAveragesEveryGradientOverTheGroup) {
  for (int n : {1, 2, 3}) {
    SCOPED_TRACE(n);
    std::vector<std::vector<float>> results(static_cast<size_t>(n));
    run_ranks_in_threads(n, [&](Comm& dp) {
      std::vector<float> params(kNumel, 1.0f), grads(kNumel);
      for (int64_t i = 0; i < kNumel; ++i) grads[size_t(i)] = grad_value(dp.rank(), i);
      auto sync = make_grad_sync(
          0, dp, {host_tensor(params.data(), {kNumel}), host_tensor(grads.data(), {kNumel}), kRanges, kGroups}, 1e-5,
          1);  // buckets of ~10 bytes: several buckets
      EXPECT_EQ(sync->owned(), (std::vector<FlatRange>{{0, kNumel}}));
      EXPECT_EQ(sync->first_copy(), dp.rank() == 0);
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
        0, dp, {host_tensor(params.data(), {kNumel}), host_tensor(grads.data(), {kNumel}), kRanges, kGroups}, 25.0, 1);
    for (int step = 0; step < 3; ++step) {
      std::fill(grads.begin(), grads.end(), float(dp.rank() + step));
      for (int g = 0; g < 3; ++g) sync->group_ready(g, true);
      sync->finish();
      EXPECT_EQ(grads, std::vector<float>(kNumel, float(step) + 0.5f)) << "step " << step;
    }
  });
}

// The reduced hook (what the CPU update's early gradient copies follow): at every stage, over two
// micro-batches, each range of owned_grads() the sync owns is reported exactly once per step, and
// when it is reported it already holds the step's final average.
TEST(GradSync, TheReducedHookReportsEachOwnedRangeOnceHoldingItsFinalAverage) {
  for (int stage : {0, 1, 2, 3})
    for (int n : {1, 2, 3})
      for (double mb : {1e-5, 25.0}) {
        SCOPED_TRACE(testing::Message() << "stage " << stage << " dp " << n << " bucket_mb " << mb);
        run_ranks_in_threads(n, [&](Comm& dp) {
          std::vector<float> params(kNumel, 1.0f), grads(kNumel, 0.0f);
          GradSyncLayout layout{stage < 3 ? host_tensor(params.data(), {kNumel}) : Tensor{},
                                stage < 2 ? host_tensor(grads.data(), {kNumel}) : Tensor{}, kRanges, kGroups};
          auto sync = make_grad_sync(stage, dp, layout, mb, dp.size());
          struct Report {
            FlatRange range;
            std::vector<float> values;  // owned_grads() over the range when it was reported
          };
          std::vector<Report> reports;
          ASSERT_TRUE(sync->set_reduced_hook([&](FlatRange r) {
            const auto* g = sync->owned_grads().ptr<float>();
            reports.push_back({r, std::vector<float>(g + r.begin, g + r.end)});
          }));
          for (int step = 0; step < 2; ++step) {
            reports.clear();
            std::fill(grads.begin(), grads.end(), 0.0f);
            for (int micro = 0; micro < 2; ++micro)
              for (int g = 0; g < int(kGroups.size()); ++g) {
                int64_t begin = kNumel;
                for (int p : kGroups[size_t(g)]) begin = std::min(begin, kRanges[size_t(p)].offset);
                const Tensor t =
                    stage >= 2 ? sync->group_grads(g) : host_tensor(grads.data() + begin, {kNumel - begin});
                for (int p : kGroups[size_t(g)])
                  for (int64_t i = 0; i < kRanges[size_t(p)].numel; ++i) {
                    const int64_t flat = kRanges[size_t(p)].offset + i;
                    t.ptr<float>()[flat - begin] += grad_value(dp.rank(), flat) + float(step + micro);
                  }
                sync->group_ready(g, micro == 1);
              }
            sync->finish();
            // The owned elements in owned_grads()' coordinates: flat at stages 0 and 1, packed at 2 and 3.
            std::vector<int> times(size_t(sync->owned_grads().numel()), 0);
            for (const Report& r : reports) {
              ASSERT_LE(r.range.end, sync->owned_grads().numel());
              for (int64_t i = r.range.begin; i < r.range.end; ++i) {
                ++times[size_t(i)];
                EXPECT_EQ(r.values[size_t(i - r.range.begin)], sync->owned_grads().ptr<float>()[i])
                    << "element " << i << " reported before its final average";
              }
            }
            int64_t at = 0;
            for (const FlatRange& r : sync->owned())
              for (int64_t i = r.begin; i < r.end; ++i, ++at)
                EXPECT_EQ(times[size_t(stage >= 2 ? at : i)], 1) << "owned element " << i << " reported";
            EXPECT_EQ(std::accumulate(times.begin(), times.end(), int64_t(0)), at) << "reports outside owned()";
            sync->gather_params();
          }
        });
      }
}

// Groups of 11, 10 and 5 elements (26 as one unit): none divides by 4, so chunks are padded.
TEST(GradSync, StageOneOwnsChunksOfTheAverageAndGathersTheParameters) {
  struct Case {
    int dp, zero_group;
    double bucket_mb;  // 1e-5: a unit per group; 25: one unit
  };
  for (Case c : {Case{1, 0, 1e-5}, Case{2, 0, 1e-5}, Case{4, 0, 1e-5}, Case{4, 2, 1e-5}, Case{3, 1, 1e-5},
                 Case{4, 0, 25.0}, Case{4, 2, 25.0}}) {
    const int shard = c.zero_group > 0 ? c.zero_group : c.dp;
    SCOPED_TRACE(testing::Message() << "dp " << c.dp << " zero_group " << shard << " bucket_mb " << c.bucket_mb);
    std::vector<std::vector<float>> grads_of(size_t(c.dp)), params_of(size_t(c.dp));
    std::vector<std::vector<FlatRange>> owned_of(size_t(c.dp));
    run_ranks_in_threads(c.dp, [&](Comm& dp) {
      const int rank = dp.rank();
      std::vector<float> params(kNumel, -1.0f), grads(kNumel);
      auto sync = make_grad_sync(
          1, dp, {host_tensor(params.data(), {kNumel}), host_tensor(grads.data(), {kNumel}), kRanges, kGroups},
          c.bucket_mb, shard);
      EXPECT_TRUE(sync->shards_over_dp());
      EXPECT_EQ(sync->first_copy(), rank < shard);
      for (int step = 0; step < 2; ++step) {
        for (int64_t i = 0; i < kNumel; ++i) grads[size_t(i)] = grad_value(rank, i) + float(step);
        for (int g = 0; g < 3; ++g) sync->group_ready(g, false);  // accumulation: nothing starts
        if (rank % 2 == 0) {
          for (int g : {0, 1, 2}) sync->group_ready(g, true);
        } else {
          for (int g : {2, 0}) sync->group_ready(g, true);  // group 1 left to finish()
        }
        sync->finish();
        // "The optimizer": owned elements take the averaged gradient; gather_params spreads them.
        for (const FlatRange& r : sync->owned())
          for (int64_t i = r.begin; i < r.end; ++i) params[size_t(i)] = grads[size_t(i)];
        sync->gather_params();
      }
      owned_of[size_t(rank)] = sync->owned();
      grads_of[size_t(rank)] = grads;
      params_of[size_t(rank)] = params;
    });
    for (int r = 0; r < c.dp; ++r) {
      std::vector<int> count(kNumel, 0);
      for (int peer = r - r % shard; peer < r - r % shard + shard; ++peer)
        for (const FlatRange& o : owned_of[size_t(peer)])
          for (int64_t i = o.begin; i < o.end; ++i) ++count[size_t(i)];
      EXPECT_EQ(count, std::vector<int>(kNumel, 1)) << "rank " << r << "'s shard group owns every element once";
      // The replicas of a chunk (same index in another shard group) own the same ranges.
      EXPECT_EQ(owned_of[size_t(r)], owned_of[size_t(r % shard)]);
    }
    for (int64_t i = 0; i < kNumel; ++i) {
      float sum = 0;
      for (int r = 0; r < c.dp; ++r) sum += grad_value(r, i) + 1.0f;
      const float avg = sum / float(c.dp);
      for (int r = 0; r < c.dp; ++r) {
        EXPECT_FLOAT_EQ(params_of[size_t(r)][size_t(i)], avg) << "rank " << r << " i " << i;
        for (const FlatRange& o : owned_of[size_t(r)]) {
          if (i >= o.begin && i < o.end) {
            EXPECT_FLOAT_EQ(grads_of[size_t(r)][size_t(i)], avg) << "rank " << r;
          }
        }
      }
    }
    for (int r = 1; r < c.dp; ++r) EXPECT_EQ(params_of[size_t(r)], params_of[0]) << "rank " << r << " diverged";
  }
}

TEST(GradSync, StageOneMergesGroupsIntoUnitsAsBucketsArePacked) {
  // Buckets of ~10 bytes: every group is a unit of its own.
  const std::vector<ShardUnit> units = shard_units(kRanges, kGroups, 1e-5, 4);
  EXPECT_EQ(units, (std::vector<ShardUnit>{{{15, 26}, 0, 1}, {{5, 15}, 1, 2}, {{0, 5}, 2, 3}}));
  // dp 4: chunks of 3, 3 and 2; the pool's two slots each hold the largest padded unit (12), each
  // rank's chunk its own block of it.
  EXPECT_EQ(grad_pool_numel(units, 4, -1), 2 * 12);
  EXPECT_EQ(grad_pool_numel(units, 1, -1), 2 * 11);
  // 25 MiB: one unit; 48 bytes: a unit closes once it holds 48 bytes (12 elements).
  EXPECT_EQ(shard_units(kRanges, kGroups, 25.0, 4), (std::vector<ShardUnit>{{{0, 26}, 0, 3}}));
  EXPECT_EQ(shard_units(kRanges, kGroups, 48.0 / (1024 * 1024), 4),
            (std::vector<ShardUnit>{{{5, 26}, 0, 2}, {{0, 5}, 2, 3}}));
  // Groups not adjacent in memory, and an empty group, which joins any unit.
  const std::vector<ShardUnit> gaps = shard_units({{0, 4}, {8, 4}}, {{1}, {}, {0}}, 25.0, 4);
  EXPECT_EQ(gaps, (std::vector<ShardUnit>{{{8, 12}, 0, 2}, {{0, 4}, 2, 3}}));
}

// Stage 2 at the layouts of stage 1's test: two micro-batches per step, each group's gradient
// written into the storage group_grads hands out (the last group's unit first, as a tied embedding
// is), every rank ends with the dp-average of the sum over micro-batches in its compact owned
// shard, and the pool bounds the gradient memory.
TEST(GradSync, StageTwoReducesEveryMicroBatchIntoTheOwnedShard) {
  struct Case {
    int dp, zero_group;
    double bucket_mb;
  };
  for (Case c : {Case{1, 0, 1e-5}, Case{2, 0, 1e-5}, Case{4, 0, 1e-5}, Case{4, 2, 1e-5}, Case{3, 1, 1e-5},
                 Case{4, 0, 25.0}, Case{4, 2, 48.0 / (1024 * 1024)}})
    for (int held : {-1, 2}) {  // the last group's unit in a shared slot, or in its own (a tied embedding's)
      const int shard = c.zero_group > 0 ? c.zero_group : c.dp;
      SCOPED_TRACE(testing::Message() << "dp " << c.dp << " zero_group " << shard << " bucket_mb " << c.bucket_mb
                                      << " held group " << held);
      const std::vector<ShardUnit> units = shard_units(kRanges, kGroups, c.bucket_mb, 4);
      std::vector<std::vector<float>> params_of(size_t(c.dp));
      run_ranks_in_threads(c.dp, [&](Comm& dp) {
        const int rank = dp.rank();
        auto gradient_bytes = [] {
          return kernels::memory_use(kernels::Device::cpu, kernels::MemoryKind::gradients).current;
        };
        auto pool_bytes = [] {
          return kernels::memory_use(kernels::Device::cpu, kernels::MemoryKind::communication).current;
        };
        dp.barrier();
        const int64_t before = gradient_bytes(), pools_before = pool_bytes();
        dp.barrier();
        std::vector<float> params(kNumel, -1.0f);
        GradSyncLayout layout{host_tensor(params.data(), {kNumel}), {}, kRanges, kGroups};
        layout.held_group = held;
        auto sync = make_grad_sync(2, dp, layout, c.bucket_mb, shard);
        EXPECT_TRUE(sync->grads_compact());
        EXPECT_EQ(sync->first_copy(), rank < shard);
        const int64_t owned = owned_numel(units, shard, rank % shard);
        EXPECT_EQ(sync->owned_grads().numel(), owned);
        dp.barrier();      // every rank's buffers exist: the gradient memory of all ranks together
        int64_t want = 0;  // the owned shards are the gradients; the pools are communication memory
        for (int r = 0; r < c.dp; ++r) want += 4 * std::max<int64_t>(owned_numel(units, shard, r % shard), 1);
        if (rank == 0) {
          EXPECT_EQ(gradient_bytes() - before, want);
          EXPECT_EQ(pool_bytes() - pools_before, c.dp * 4 * grad_pool_numel(units, shard, unit_of_group(units, held)));
        }
        dp.barrier();
        for (int step = 0; step < 2; ++step) {
          for (int mb = 0; mb < 2; ++mb) {
            const Tensor last = sync->group_grads(2);  // held from the start, as a tied embedding's
            for (int g = 0; g < 3; ++g) {
              const Tensor t = g == 2 ? last : sync->group_grads(g);
              int64_t begin = kNumel;
              for (int p : kGroups[size_t(g)]) begin = std::min(begin, kRanges[size_t(p)].offset);
              auto* v = static_cast<float*>(t.data);
              for (int64_t i = 0; i < t.numel(); ++i) {
                EXPECT_EQ(v[i], 0.0f) << "storage handed out zeroed";
                v[i] += grad_value(rank, begin + i) + float(step + mb);
              }
              sync->group_ready(g, mb == 1);
            }
          }
          sync->finish();
          const auto* g = static_cast<const float*>(sync->owned_grads().data);
          int64_t at = 0;
          for (const FlatRange& r : sync->owned())
            for (int64_t i = r.begin; i < r.end; ++i, ++at) {
              float sum = 0;
              for (int peer = 0; peer < c.dp; ++peer) sum += 2 * grad_value(peer, i) + float(2 * step + 1);
              EXPECT_NEAR(g[at], sum / float(c.dp), 1e-3f) << "rank " << rank << " i " << i;
              params[size_t(i)] = g[at];
            }
          sync->gather_params();
        }
        params_of[size_t(rank)] = params;
      });
      for (int64_t i = 0; i < kNumel; ++i) {
        float sum = 0;
        for (int r = 0; r < c.dp; ++r) sum += 2 * grad_value(r, i) + 3.0f;
        EXPECT_NEAR(params_of[0][size_t(i)], sum / float(c.dp), 1e-3f) << "i " << i;
      }
      for (int r = 1; r < c.dp; ++r) EXPECT_EQ(params_of[size_t(r)], params_of[0]) << "rank " << r << " diverged";
    }
}

TEST(GradSync, StageTwoPoolHoldsTwoUnitsAndTheHeldOne) {
  const std::vector<ShardUnit> units = shard_units(kRanges, kGroups, 1e-5, 4);
  // Units of 11, 10 and 5 elements at shard 4: two slots of the largest padded to 12; a held unit
  // (group 2's, of 5 elements) adds a slot of its own padded size, 8.
  EXPECT_EQ(unit_of_group(units, 2), 2);
  EXPECT_EQ(unit_of_group(units, -1), -1);
  EXPECT_EQ(grad_pool_numel(units, 4, -1), 2 * 12);
  EXPECT_EQ(grad_pool_numel(units, 4, 2), 2 * 12 + 8);
  EXPECT_EQ(grad_pool_numel(units, 4, 0), 2 * 12 + 12);  // the held unit is the largest: the others 12 and 8
  EXPECT_EQ(param_pool_numel(units, 4, 2), 2 * 12 + 8);
  const std::vector<ShardUnit> one = shard_units(kRanges, kGroups, 25.0, 4);
  EXPECT_EQ(grad_pool_numel(one, 4, -1), 28);  // one unit, one slot
  EXPECT_EQ(grad_pool_numel(one, 4, 0), 28);   // ... its own
  EXPECT_EQ(owned_numel(units, 4, 0) + owned_numel(units, 4, 1) + owned_numel(units, 4, 2) + owned_numel(units, 4, 3),
            kNumel);
}

// Stage 3: the sync owns the values of its owned() ranges; group_params hands out each group's
// values gathered from every rank's shard, in forward and in backward order (a group held while
// the next is requested), and gathers again after gather_params() (an update).
TEST(GradSync, StageThreeGathersEveryGroupsValuesFromTheShards) {
  for (auto [n, mb] : {std::tuple{1, 1e-5}, std::tuple{2, 1e-5}, std::tuple{3, 1e-5}, std::tuple{3, 25.0}})
    for (int held : {-1, 2}) {
      SCOPED_TRACE(::testing::Message() << "dp " << n << " bucket_mb " << mb << " held group " << held);
      run_ranks_in_threads(n, [&, mb = mb](Comm& dp) {
        GradSyncLayout layout{{}, {}, kRanges, kGroups};
        layout.held_group = held;
        auto sync = make_grad_sync(3, dp, layout, mb, dp.size());
        ASSERT_TRUE(sync->params_compact());
        ASSERT_TRUE(sync->grads_compact());
        const kernels::Tensor own = sync->owned_params();
        auto fill = [&](float scale) {  // every rank writes its owned elements' values
          int64_t at = 0;
          for (const FlatRange& r : sync->owned())
            for (int64_t i = r.begin; i < r.end; ++i) own.ptr<float>()[at++] = scale * float(i);
          ASSERT_EQ(at, own.numel());
        };
        auto expect_group = [&](int g, bool backward, float scale) { expect_gathered(*sync, g, backward, scale); };
        fill(0.5f);
        for (int g = int(kGroups.size()) - 1; g >= 0; --g) {  // forward
          expect_group(g, false, 0.5f);
          sync->group_params_done(g);
        }
        expect_group(0, true, 0.5f);  // backward; the first group held through the second
        expect_group(1, true, 0.5f);
        sync->group_params_done(1);
        sync->group_params_done(0);
        expect_group(2, true, 0.5f);
        sync->group_params_done(2);
        // At most three units: each gathered once, backward reusing what forward gathered, except
        // that with three units in the two shared slots forward's first (group 2's) is gone by the
        // time backward asks for it again; in a slot of its own it stays.
        const auto units = int64_t(shard_units(kRanges, kGroups, mb, sizeof(float)).size());
        EXPECT_EQ(sync->stats().buckets, units + (units == 3 && held < 0 ? 1 : 0));
        fill(-2.0f);  // the optimizer's update, then the step's gather_params()
        const int64_t before = sync->stats().buckets;
        sync->gather_params();
        for (int g = int(kGroups.size()) - 1; g >= 0; --g) {
          expect_group(g, false, -2.0f);
          sync->group_params_done(g);
        }
        EXPECT_EQ(sync->stats().buckets, before + units);  // gathered again after the update
      });
    }
  EXPECT_EQ(param_pool_numel(shard_units(kRanges, kGroups, 1e-5, 4), 4, -1), 2 * 12);
}

// Stage 3 with offloaded owned values (GradSyncLayout::owned_values, parallel.offload_params): each
// gather takes its unit's chunk through OwnedValues, having said ahead which unit it takes after the
// current one, and the values are dropped before they change; the gathered values are the current
// ones in forward and backward, also after an update changes them. (The read ahead on a thread of
// its own is the offload's ValueReader: tests/trainer/optim/test_value_reader.cpp.)
class StoreValues final : public OwnedValues {
 public:
  std::vector<float> store;  // this rank's owned values, compact (the offload store's)
  int64_t takes = 0, taken_as_announced = 0, drops = 0;
  void ahead(int unit, int64_t, int64_t) override { announced_ = unit; }
  void take(int unit, int64_t begin, Tensor out) override {
    ASSERT_LE(begin + out.numel(), int64_t(store.size()));
    std::copy_n(store.begin() + begin, out.numel(), out.ptr<float>());
    ++takes;
    taken_as_announced += unit == announced_;
  }
  void drop() override {
    ++drops;
    announced_ = -1;
  }

 private:
  int announced_ = -1;
};

TEST(GradSync, StageThreeTakesOffloadedValuesAsItGathers) {
  for (int n : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << "dp " << n);
    run_ranks_in_threads(n, [&](Comm& dp) {
      StoreValues values;
      GradSyncLayout layout{{}, {}, kRanges, kGroups};
      layout.owned_values = &values;
      auto sync = make_grad_sync(3, dp, layout, 1e-5, dp.size());  // three units
      auto fill = [&](float scale) {                               // the optimizer's update of the owned values
        values.store.clear();
        for (const FlatRange& r : sync->owned())
          for (int64_t i = r.begin; i < r.end; ++i) values.store.push_back(scale * float(i));
      };
      auto expect_group = [&](int g, bool backward, float scale) {
        expect_gathered(*sync, g, backward, scale);
        sync->group_params_done(g);
      };
      auto step = [&](float scale) {  // forward, backward, the update, the gather
        for (int g = int(kGroups.size()) - 1; g >= 0; --g) expect_group(g, false, scale);
        for (int g = 0; g < int(kGroups.size()); ++g) expect_group(g, true, scale);
      };
      auto update = [&](float scale) {
        const int64_t drops = values.drops;
        sync->finish();
        EXPECT_GT(values.drops, drops) << "nothing dropped before the update";
        fill(scale);
        sync->gather_params();
      };
      fill(0.5f);
      step(0.5f);
      update(-2.0f);
      step(-2.0f);
      update(3.0f);
      // A pass cut short (after group 0 in backward order): units 0 and 1 gathered, unit 2
      // announced, and nobody takes it before the update; the next forward starts with unit 2.
      expect_group(0, true, 3.0f);
      update(-1.5f);
      step(-1.5f);
      EXPECT_GT(values.taken_as_announced, 0) << "no unit announced ahead, of " << values.takes;
    });
  }
}

// Stage 3 with a held group as a tied embedding's (the last group, held from first to last in
// forward and in backward): it has a slot of its own, so every other unit still finds a free slot
// for its prefetch, and each unit is gathered once per pass pair.
TEST(GradSync, StageThreeHoldsTheHeldGroupInItsOwnSlot) {
  run_ranks_in_threads(2, [&](Comm& dp) {
    const std::vector<ShardUnit> units = shard_units(kRanges, kGroups, 1e-5, 4);
    auto pool_bytes = [] {
      return kernels::memory_use(kernels::Device::cpu, kernels::MemoryKind::communication).current;
    };
    dp.barrier();
    const int64_t before = pool_bytes();
    dp.barrier();
    GradSyncLayout layout{{}, {}, kRanges, kGroups};
    layout.held_group = 2;
    auto sync = make_grad_sync(3, dp, layout, 1e-5, dp.size());
    dp.barrier();
    if (dp.rank() == 0) {  // the gradient pool and the parameter pool, each 2 × 12 + 6 at dp 2
      EXPECT_EQ(pool_bytes() - before, 2 * 4 * (grad_pool_numel(units, 2, 2) + param_pool_numel(units, 2, 2)));
    }
    EXPECT_EQ(param_pool_numel(units, 2, 2), 2 * 12 + 6);
    dp.barrier();
    const kernels::Tensor own = sync->owned_params();
    int64_t at = 0;
    for (const FlatRange& r : sync->owned())
      for (int64_t i = r.begin; i < r.end; ++i) own.ptr<float>()[at++] = float(i) + 0.5f;
    auto check = [&](int g, bool backward) {
      const kernels::Tensor v = sync->group_params(g, backward);
      int64_t begin = INT64_MAX;
      for (int p : kGroups[size_t(g)]) begin = std::min(begin, kRanges[size_t(p)].offset);
      for (int p : kGroups[size_t(g)])
        for (int64_t i = 0; i < kRanges[size_t(p)].numel; ++i) {
          const int64_t flat = kRanges[size_t(p)].offset + i;
          EXPECT_EQ(v.ptr<float>()[flat - begin], float(flat) + 0.5f) << "group " << g << " element " << flat;
        }
    };
    for (int pass = 0; pass < 2; ++pass) {
      check(2, false);  // forward: the embedding, held until after the head
      check(1, false);
      // Group 0's unit is already being gathered while group 1 computes, the embedding held: with
      // the embedding in a shared slot, both would be taken and nothing prefetched.
      EXPECT_EQ(sync->stats().buckets, 3 * pass + 3) << "the next unit prefetched";
      sync->group_params_done(1);
      check(0, false);
      sync->group_params_done(0);
      sync->group_params_done(2);
      check(2, true);  // backward: the tied head's read of the embedding first
      check(0, true);
      sync->group_params_done(0);
      check(1, true);
      sync->group_params_done(1);
      sync->group_params_done(2);
      EXPECT_EQ(sync->stats().buckets, 3 * (pass + 1)) << "every unit gathered once per step";
      sync->gather_params();
    }
  });
}

}  // namespace
}  // namespace llmtrain::parallel

namespace llmtrain::parallel {
namespace {

// Expert parallelism with sharded experts (make_expert_grad_sync): 4 ranks of dp × cp, ep 2, so
// the expert-data-parallel groups are {0, 2} and {1, 3}. Parameter 2 of kRanges is an expert's: its
// gradient is averaged over the rank's edp group and divided by ep, the others' over all 4; owned()
// splits at the experts' range, whose first copies are the edp group's.
TEST(GradSync, ExpertSyncReducesTheExpertsOverTheirReplicas) {
  for (int stage : {0, 1}) {
    SCOPED_TRACE(stage);
    std::vector<std::vector<float>> results(4);
    std::vector<std::vector<FlatRange>> owned(4);
    run_ranks_in_threads(4, [&](Comm& dp) {
      std::unique_ptr<Comm> edp = dp.split(dp.rank() % 2, dp.rank(), "edp");
      std::vector<float> params(kNumel, 1.0f), grads(kNumel);
      for (int64_t i = 0; i < kNumel; ++i) grads[size_t(i)] = grad_value(dp.rank(), i);
      const Tensor p = host_tensor(params.data(), {kNumel}), g = host_tensor(grads.data(), {kNumel});
      // kGroups {3}, {2, 1}, {0} with parameter 2 taken out (dense), or alone (experts).
      auto dense = make_grad_sync(stage, dp, {p, g, {{0, 5}, {5, 7}, {15, 11}}, {{2}, {1}, {0}}}, 1e-5, stage ? 4 : 1);
      auto experts = make_grad_sync(stage, *edp, {p, g, {{12, 3}}, {{}, {0}, {}}}, 1e-5, stage ? 2 : 1);
      auto sync = make_expert_grad_sync(std::move(dense), std::move(experts), {{12, 15}}, g, 2);
      EXPECT_TRUE(sync->shards_over_dp());
      EXPECT_EQ(sync->first_copy_at(13), stage == 1 || edp->rank() == 0);
      EXPECT_EQ(sync->first_copy_at(20), stage == 1 || dp.rank() == 0);
      for (int g2 : {0, 1, 2}) sync->group_ready(g2, true);
      sync->finish();
      sync->gather_params();
      results[size_t(dp.rank())] = grads;
      owned[size_t(dp.rank())] = sync->owned();
    });
    for (int r = 0; r < 4; ++r) {
      if (stage == 0) {
        EXPECT_EQ(owned[size_t(r)], (std::vector<FlatRange>{{0, 12}, {12, 15}, {15, kNumel}}));
      }
      for (const FlatRange& o : owned[size_t(r)])
        for (int64_t i = o.begin; i < o.end; ++i) {
          const bool expert = i >= 12 && i < 15;
          float want = 0;
          for (int q = 0; q < 4; ++q)
            if (!expert || q % 2 == r % 2) want += grad_value(q, i);
          want = expert ? want / 2 / 2 : want / 4;
          EXPECT_FLOAT_EQ(results[size_t(r)][size_t(i)], want) << "rank " << r << " element " << i;
        }
    }
    if (stage == 1) {  // every element owned once by the dense sync's 4 ranks, or by each edp group's 2
      std::vector<int> count(kNumel, 0);
      for (const auto& o : owned)
        for (const FlatRange& x : o)
          for (int64_t i = x.begin; i < x.end; ++i) ++count[size_t(i)];
      for (int64_t i = 0; i < kNumel; ++i) EXPECT_EQ(count[size_t(i)], i >= 12 && i < 15 ? 2 : 1) << i;
    }
  }
}

}  // namespace
}  // namespace llmtrain::parallel
