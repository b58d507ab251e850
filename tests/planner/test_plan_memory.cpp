// The planner's memory per rank against what ranks allocate: for layouts of dp, tp, pp and ZeRO that
// train on this CPU (ranks as threads of this process, one optimizer step each), the predicted
// peak (planner/layout_search.h: the one memory account's total, plus the device's reserved
// bytes, none on a CPU) summed over the ranks lies within 10% of the allocator's peak of all
// Buffers at once (kernels::memory_use: every kind, `other` included), which this process's
// ranks together reached. docs/plan.md §3 says what is and is not counted. And the tensor-parallel
// bytes the performance model prices against those a run sends (docs/plan.md §2).
#include "common/recipe/recipe_check.h"
#include "parallel/mesh.h"
#include "planner/layout_search.h"
#include "planner/perf_model.h"
#include "tests/common/test_layout.h"
#include "tests/parallel/comm/comm_counting.h"
#include "tests/trainer/loop/train_step_fixture.h"
#include "trainer/checkpoint/async_checkpoint.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/checkpointer.h"
#include "trainer/placement/memory.h"

namespace llmtrain::trainer {
namespace {

class PlanMemory : public TrainStepTest {
 protected:
  struct Case {
    int tp, pp, dp, zero;
    Precision precision = Precision::fp32;
    ActivationCheckpointing recompute = ActivationCheckpointing::none;
  };
};

TEST_F(PlanMemory, PredictedPeakPerRankIsWithinTenPercentOfTheMeasured) {
  recipe_.model.layers = 4;
  const planner::DeviceSpec cpu = planner::device_memory("cpu");
  const std::vector<Case> cases = {
      {1, 1, 2, 0},
      {1, 1, 2, 1},
      {1, 1, 2, 2, Precision::bf16},
      {1, 1, 2, 3},
      {2, 1, 1, 0, Precision::fp32, ActivationCheckpointing::full},
      {1, 2, 1, 0},
      {2, 2, 1, 0, Precision::bf16},
      {1, 2, 2, 1, Precision::fp32, ActivationCheckpointing::selective},
  };
  for (const Case& c : cases) {
    Recipe r = recipe_;
    r.parallel.tp = c.tp, r.parallel.pp = c.pp, r.parallel.dp = c.dp, r.parallel.zero = c.zero;
    fill_zero_group(r.parallel);
    r.parallel.bucket_mb = 0.01;
    r.train.precision = c.precision;
    r.train.activation_checkpointing = c.recompute;
    const int world = c.tp * c.pp * c.dp;
    ASSERT_TRUE(recipe_check(r, {world, "test", false}).empty());
    int64_t predicted = 0;
    for (int rank = 0; rank < world; ++rank)
      predicted +=
          planner::predict_rank_memory(r, parallel::Mesh({c.tp, c.pp, c.dp}, rank).coord(), {cpu, world, world}).bytes;
    kernels::memory_reset_peaks();
    int64_t measured = 0;
    parallel::run_ranks_in_threads(world, [&](parallel::Comm& comm) {
      {
        Rank me(r, prefix_, comm.split(0, comm.rank(), "world"), r.parallel.dp, r.parallel.pp);
        me.step->run(0, 0);
        comm.barrier();
        if (comm.rank() == 0) measured = kernels::memory_use(kernels::Device::cpu).peak;
        comm.barrier();
      }
    });
    const double ratio = double(predicted) / double(measured);
    SCOPED_TRACE(fmt::format("tp {} pp {} dp {} zero {} {} recompute {}: predicted {} B, measured {} B, ratio {:.4f}",
                             c.tp, c.pp, c.dp, c.zero, to_string(c.precision), to_string(c.recompute), predicted,
                             measured, ratio));
    std::printf("tp %d pp %d dp %d zero %d %s recompute %s: predicted %lld B, measured peak %lld B, ratio %.4f\n", c.tp,
                c.pp, c.dp, c.zero, to_string(c.precision), to_string(c.recompute), static_cast<long long>(predicted),
                static_cast<long long>(measured), ratio);
    EXPECT_GT(ratio, 0.9);
    EXPECT_LT(ratio, 1.1);
  }
}

// Expert parallelism: a MoE model at dp 2 and ep 2, where at ZeRO 0 and 1 each rank holds 2 of the
// 4 experts (and the experts' activations are sized for ep × its picks), against dp 2 at ep 1.
TEST_F(PlanMemory, PredictedPeakWithExpertParallelismIsWithinTenPercentOfTheMeasured) {
  recipe_.model.moe.experts = 4, recipe_.model.moe.top_k = 2, recipe_.model.moe.ffn_hidden = 64;
  const planner::DeviceSpec cpu = planner::device_memory("cpu");
  for (int ep : {1, 2})
    for (int zero : {0, 1, 3}) {
      Recipe r = recipe_;
      r.parallel.dp = 2, r.parallel.ep = ep, r.parallel.zero = zero;
      fill_zero_group(r.parallel);
      r.parallel.bucket_mb = 0.01;
      ASSERT_TRUE(recipe_check(r, {2, "test", false}).empty());
      int64_t predicted = 0;
      for (int rank = 0; rank < 2; ++rank)
        predicted += planner::predict_rank_memory(r, parallel::Mesh({1, 1, 2, 1, ep}, rank).coord(), {cpu, 2, 2}).bytes;
      kernels::memory_reset_peaks();
      int64_t measured = 0;
      parallel::run_ranks_in_threads(2, [&](parallel::Comm& comm) {
        Rank me(r, prefix_, comm.split(0, comm.rank(), "world"), 2);
        me.step->run(0, 0);
        comm.barrier();
        if (comm.rank() == 0) measured = kernels::memory_use(kernels::Device::cpu).peak;
        comm.barrier();
      });
      const double ratio = double(predicted) / double(measured);
      SCOPED_TRACE(fmt::format("MoE ep {} zero {}: predicted {} B, measured {} B, ratio {:.4f}", ep, zero, predicted,
                               measured, ratio));
      std::printf("MoE dp 2 ep %d zero %d: predicted %lld B, measured peak %lld B, ratio %.4f\n", ep, zero,
                  static_cast<long long>(predicted), static_cast<long long>(measured), ratio);
      EXPECT_GT(ratio, 0.9);
      EXPECT_LT(ratio, 1.1);
    }
}

// checkpoint.async's host snapshot: for layouts of every kind (dp, ZeRO 1-3 with shard groups,
// tp, pp, 16-bit with an fp32 master), the plan's checkpoint_snapshot on each rank is the size of
// the slices that rank writes (checkpoint_slices, as the Checkpointer takes them), which is what
// the asynchronous writer copies. At ZeRO >= 1 an owned chunk may hold a tied copy or a
// tensor-parallel replica, which is not written: there the plan may be larger, never smaller.
TEST_F(PlanMemory, AsyncCheckpointSnapshotIsWhatEachRankWrites) {
  recipe_.model.layers = 4;
  const std::vector<Case> cases = {
      {1, 1, 2, 0},
      {1, 1, 4, 1},
      {1, 1, 2, 2, Precision::bf16},
      {1, 1, 2, 3},
      {2, 1, 1, 0},
      {1, 2, 1, 0},
      {2, 2, 1, 0, Precision::bf16},
      {1, 2, 2, 1},
      {2, 1, 2, 3, Precision::bf16},
  };
  for (const Case& c : cases) {
    Recipe r = recipe_;
    r.parallel.tp = c.tp, r.parallel.pp = c.pp, r.parallel.dp = c.dp, r.parallel.zero = c.zero;
    if (c.dp == 4) r.parallel.zero_group = 2;
    fill_zero_group(r.parallel);
    r.parallel.bucket_mb = 0.01;
    r.train.precision = c.precision;
    r.checkpoint.async = true;
    const int world = c.tp * c.pp * c.dp;
    ASSERT_TRUE(recipe_check(r, {world, "test", false}).empty());
    std::vector<int64_t> planned(world), written(world);
    parallel::run_ranks_in_threads(world, [&](parallel::Comm& comm) {
      Rank me(r, prefix_, comm.split(0, comm.rank(), "world"), r.parallel.dp, r.parallel.pp);
      planned[comm.rank()] = memory_plan(r, test_layout(r), me.mesh.coord()).checkpoint_snapshot;
      written[comm.rank()] = AsyncCheckpointWriter::snapshot_bytes_of(checkpoint_slices(
          me.model, &me.step->optimizer(), me.comms.dp->rank() == 0, me.step->grad_sync().first_copy()));
    });
    int64_t total = 0;
    for (int rank = 0; rank < world; ++rank) {
      SCOPED_TRACE(
          fmt::format("tp {} pp {} dp {} zero {} {}: rank {}", c.tp, c.pp, c.dp, c.zero, to_string(c.precision), rank));
      if (c.zero == 0)
        EXPECT_EQ(planned[rank], written[rank]);
      else
        EXPECT_GE(planned[rank], written[rank]);
      total += written[rank];
      std::printf("tp %d pp %d dp %d zero %d %s rank %d: snapshot planned %lld B, written %lld B\n", c.tp, c.pp, c.dp,
                  c.zero, to_string(c.precision), rank, static_cast<long long>(planned[rank]),
                  static_cast<long long>(written[rank]));
    }
    EXPECT_GT(total, 0);
  }
  // Expert parallelism (a MoE model at dp 2, ep 2): with sharded experts (ZeRO 0 and 1, also with a
  // bf16 master) rank 1 writes its experts too; at ZeRO 3 ZeRO's shards hold them. What the
  // Checkpointer writes (rank_checkpoint_slices).
  recipe_.model.moe.experts = 4, recipe_.model.moe.top_k = 2, recipe_.model.moe.ffn_hidden = 64;
  for (const Case& c : {Case{1, 1, 2, 0}, Case{1, 1, 2, 1}, Case{1, 1, 2, 0, Precision::bf16}, Case{1, 1, 2, 3}}) {
    Recipe r = recipe_;
    r.parallel.dp = 2, r.parallel.ep = 2, r.parallel.zero = c.zero;
    fill_zero_group(r.parallel);
    r.parallel.bucket_mb = 0.01;
    r.train.precision = c.precision;
    r.checkpoint.async = true;
    ASSERT_TRUE(recipe_check(r, {2, "test", false}).empty());
    std::vector<int64_t> planned(2), written(2);
    parallel::run_ranks_in_threads(2, [&](parallel::Comm& comm) {
      Rank me(r, prefix_, comm.split(0, comm.rank(), "world"), 2);
      planned[comm.rank()] = memory_plan(r, test_layout(r), me.mesh.coord()).checkpoint_snapshot;
      written[comm.rank()] = AsyncCheckpointWriter::snapshot_bytes_of(
          rank_checkpoint_slices(me.model, *me.step, me.comms.replicas().rank()));
    });
    for (int rank = 0; rank < 2; ++rank) {
      SCOPED_TRACE(fmt::format("MoE dp 2 ep 2 zero {} {}: rank {}", c.zero, to_string(c.precision), rank));
      EXPECT_GT(written[rank], 0);
      if (c.zero == 0)
        EXPECT_EQ(planned[rank], written[rank]);
      else
        EXPECT_GE(planned[rank], written[rank]);
    }
  }
}

// The tensor-parallel traffic the performance model prices: for tp 2 layouts of both model families,
// with and without sequence parallelism and with full recomputation, the bytes one tp rank sends
// per step by the model (StepPrediction::tp_bytes) equal those the communicator counts
// (tests/parallel/comm/comm_counting.h around the mesh's tp group) in one optimizer step after a warm one.
TEST_F(PlanMemory, TensorParallelBytesPerStepAreWhatTheRunSends) {
  struct Case {
    ModelFamily family;
    bool sp;
    ActivationCheckpointing recompute;
  };
  const Case cases[] = {
      {ModelFamily::llama, false, ActivationCheckpointing::none},
      {ModelFamily::llama, true, ActivationCheckpointing::none},
      {ModelFamily::gpt2, false, ActivationCheckpointing::none},
      {ModelFamily::gpt2, true, ActivationCheckpointing::none},
      {ModelFamily::llama, false, ActivationCheckpointing::full},
  };
  planner::DeviceSpec dev = planner::device_lookup("h100");  // any row: bytes do not depend on rates
  for (const Case& c : cases) {
    Recipe r = recipe_;
    r.model.family = c.family;
    r.model.kv_heads = r.model.heads;
    r.parallel.tp = 2, r.parallel.pp = 1, r.parallel.dp = 1;
    r.parallel.sequence_parallel = c.sp;
    r.train.activation_checkpointing = c.recompute;
    r.train.micro_batch = 2, r.train.global_batch = 4;  // two micro-batches a step
    ASSERT_TRUE(recipe_check(r, {2, "test", false}).empty());
    const double predicted = planner::predict_step(r, {dev, 2, 8, 50e9}).tp_bytes;
    int64_t counted = 0;
    parallel::run_ranks_in_threads(2, [&](parallel::Comm& world) {
      const parallel::Mesh mesh({2, 1, 1}, world.rank());
      parallel::MeshComms comms = parallel::make_mesh_comms(mesh, world.split(0, world.rank(), "world"));
      auto counting = std::make_unique<parallel::CountingComm>(std::move(comms.tp));
      parallel::CountingComm& tp = *counting;
      comms.tp = std::move(counting);
      GptDataset data({{prefix_, 1.0}}, r.model.seq_len, 7, r.model.vocab);
      Sampler sampler(r.train.global_batch, r.train.micro_batch, 0, 1);
      MicroBatchReader batches(data, sampler, r.model.seq_len);
      const Placement placement = place(r, test_layout(r), mesh.coord());
      Model model(r.model, placement.model, *comms.tp);
      model.init_parameters(1);
      TrainStep step(r, placement, model, comms, batches);
      step.master_from_params();
      step.run(0, 0);
      tp.reset();
      step.run(1, r.train.global_batch);
      if (world.rank() == 0) counted = tp.bytes_sent();
    });
    SCOPED_TRACE(fmt::format("{} sp {} recompute {}: predicted {} B, counted {} B", to_string(c.family), c.sp,
                             to_string(c.recompute), predicted, counted));
    EXPECT_GT(counted, 0);
    EXPECT_DOUBLE_EQ(predicted, double(counted));
  }
}

}  // namespace
}  // namespace llmtrain::trainer
