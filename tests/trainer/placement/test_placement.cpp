// The placement (trainer/placement/placement.h) is the one definition the memory account, the
// planner and the step's allocations read: for every layout of the "no behaviour change" matrix —
// dp 1, dp 2 ZeRO 1, dp 2 ZeRO 3 with nvme offload and offload_params, tp 2 with sequence
// parallelism, pp 2 interleaved, pp 2 zero-bubble, cp 2, ep 2 with MoE, bf16 — each rank's step
// is built from place() and keeps that placement, the planner's account of the rank is the account
// of that placement, and what the ranks allocate (counted by the allocator, kind by kind, with
// every rank of the layout alive in this process) is the sum of their accounts.
#include <filesystem>

#include "planner/layout_search.h"
#include "tests/common/test_layout.h"
#include "tests/trainer/loop/train_step_fixture.h"
#include "trainer/placement/memory.h"
#include "trainer/placement/placement.h"

namespace llmtrain::trainer {
namespace {

class PlacementTest : public TrainStepTest {};

struct Row {
  const char* name;
  int tp = 1, pp = 1, dp = 1, cp = 1, ep = 1, zero = 0;
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  int virtual_stages = 1;
  bool sp = false, moe = false, nvme = false, bf16 = false;
};

TEST_F(PlacementTest, TheAccountThePlannerAndTheStepsAllocationsShareOnePlacement) {
  using PS = PipelineSchedule;
  const std::vector<Row> rows = {
      {.name = "dp 1"},
      {.name = "dp 2 zero 1", .dp = 2, .zero = 1},
      {.name = "dp 2 zero 3 nvme offload_params", .dp = 2, .zero = 3, .nvme = true},
      {.name = "tp 2 sp", .tp = 2, .sp = true},
      {.name = "pp 2 interleaved", .pp = 2, .schedule = PS::interleaved, .virtual_stages = 2},
      {.name = "pp 2 zero_bubble", .pp = 2, .schedule = PS::zero_bubble},
      {.name = "cp 2", .cp = 2},
      {.name = "ep 2 moe", .dp = 2, .ep = 2, .moe = true},
      {.name = "bf16", .bf16 = true},
  };
  const planner::DeviceSpec cpu = planner::device_memory("cpu");
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    Recipe r = recipe_;
    r.model.layers = 4;
    r.parallel.tp = row.tp, r.parallel.pp = row.pp, r.parallel.dp = row.dp, r.parallel.cp = row.cp;
    r.parallel.ep = row.ep, r.parallel.zero = row.zero, r.parallel.sequence_parallel = row.sp;
    r.parallel.pp_schedule = row.schedule, r.parallel.virtual_stages = row.virtual_stages;
    r.parallel.bucket_mb = 0.01;  // several buckets and ZeRO units
    if (row.moe) r.model.moe = {.experts = 4, .top_k = 2, .ffn_hidden = 32, .aux_loss = 0.1, .z_loss = 0.01};
    if (row.nvme) {
      r.parallel.offload = OffloadKind::nvme, r.parallel.offload_params = true;
      r.parallel.offload_path = (std::filesystem::path(prefix_).parent_path() / "offload").string();
    }
    if (row.bf16) r.train.precision = Precision::bf16;
    fill_zero_group(r.parallel);
    const int world = row.tp * row.pp * row.dp * row.cp;
    ASSERT_TRUE(recipe_check(r, {world, "test", false}).empty());
    const llmtrain::Layout layout = test_layout(r);

    // Each rank's placement and its account, and the planner's account of the same rank.
    std::vector<Placement> placed;
    MemoryAccount sum;
    for (int rank = 0; rank < world; ++rank) {
      const parallel::MeshCoord coord = parallel::Mesh({row.tp, row.pp, row.dp, row.cp, row.ep}, rank).coord();
      placed.push_back(place(r, layout, coord));
      const MemoryAccount a = memory_account(placed.back());
      const planner::RankMemory planned = planner::predict_rank_memory(r, coord, {cpu, world, world});
      EXPECT_EQ(planned.account.total(), a.total()) << "rank " << rank;
      EXPECT_EQ(planned.account.optimizer, a.optimizer) << "rank " << rank;
      EXPECT_EQ(planned.account.offload_disk, a.offload_disk) << "rank " << rank;
      sum.parameters += a.parameters, sum.gradients += a.gradients, sum.optimizer += a.optimizer;
      sum.activations += a.activations, sum.communication += a.communication;
    }
    // The ranks, built from those placements, all alive at once: the allocator counts their sum.
    MemoryAccount got;
    parallel::run_ranks_in_threads(world, [&](parallel::Comm& comm) {
      Rank me(r, prefix_, comm.split(0, comm.rank(), "world"), row.dp, row.pp);
      const Placement& mine = me.step->placement();
      const Placement& expected = placed[size_t(comm.rank())];
      EXPECT_EQ(mine.owned, expected.owned);
      EXPECT_EQ(mine.schedule.size(), expected.schedule.size());
      EXPECT_EQ(mine.groups, expected.groups);
      EXPECT_EQ(mine.values.bytes(), expected.values.bytes());
      me.step->run(0, 0);
      comm.barrier();
      if (comm.rank() == 0) got = memory_measured(kernels::Device::cpu, false);
      comm.barrier();
    });
    EXPECT_GT(sum.parameters + sum.gradients + sum.optimizer, 0);
    std::printf(
        "%-34s %d ranks: parameters %lld, gradients %lld, optimizer %lld, activations %lld, communication "
        "%lld bytes, allocated as counted\n",
        row.name, world, (long long)sum.parameters, (long long)sum.gradients, (long long)sum.optimizer,
        (long long)sum.activations, (long long)sum.communication);
    EXPECT_EQ(got.parameters, sum.parameters);
    EXPECT_EQ(got.gradients, sum.gradients);
    EXPECT_EQ(got.optimizer, sum.optimizer);
    EXPECT_EQ(got.activations, sum.activations);
    EXPECT_EQ(got.communication, sum.communication);
  }
}

// Where the update runs, decided in one place: offload host on a cuda rank puts AdamW on the CPU
// (and beside backward only without clipping, loss scaling or skipped steps), nvme on the device;
// the planner's price of the CPU update reads the same per-element bytes the account counts.
TEST_F(PlacementTest, WhereTheUpdateRunsIsDecidedOnce) {
  Recipe r = recipe_;
  r.parallel.dp = 1;
  r.train.device = DeviceKind::cuda;
  r.parallel.offload = OffloadKind::host;
  fill_zero_group(r.parallel);
  Placement p = place(r, test_layout(r), {0, 0, 0});
  EXPECT_EQ(p.update, UpdateSite::cpu);
  EXPECT_FALSE(p.update_during_backward);  // grad_clip 1.0
  EXPECT_EQ(p.offload_store.where, Residence::pinned_host);
  EXPECT_EQ(p.cpu_update_copies, p.owned * cpu_update_bytes_per_element(p.layout, false));
  EXPECT_EQ(memory_account(p).offload_host, p.cpu_update_copies + p.offload_host_slots + p.offload_store.bytes());
  r.train.grad_clip = 0;
  EXPECT_TRUE(place(r, test_layout(r), {0, 0, 0}).update_during_backward);
  r.train.precision = Precision::fp16;
  EXPECT_FALSE(place(r, test_layout(r), {0, 0, 0}).update_during_backward);
  r.train.precision = Precision::fp32;
  r.parallel.offload = OffloadKind::nvme, r.parallel.offload_path = "/tmp/offload";
  p = place(r, test_layout(r), {0, 0, 0});
  EXPECT_EQ(p.update, UpdateSite::device);
  EXPECT_EQ(p.offload_store.where, Residence::file);
  EXPECT_EQ(memory_account(p).offload_disk, p.offload_store.bytes());
  EXPECT_EQ(p.moments.bytes() + p.master.bytes(), 0);  // the state is in the store
}

}  // namespace
}  // namespace llmtrain::trainer
