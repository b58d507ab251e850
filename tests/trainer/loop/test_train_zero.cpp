// ZeRO stages 1, 2 and 3 as a unit of the training step (trainer/loop/train_step.h, thread ranks on the
// in-process communicator): data-parallel ranks with sharded optimizer state, gradients and
// parameters (hybrid sharding too) take the steps of one rank at zero 0, checkpoints move between
// the stages, non-finite steps are skipped on every shard, 16-bit storage trains sharded and
// resumes bitwise, and bf16 gradients reduced in bf16 move half the bytes.
#include "tests/trainer/loop/train_step_fixture.h"

namespace llmtrain::trainer {
namespace {

// ZeRO stage 1: a small model (2 layers, hidden 64) at dp 2 (two micro-batches accumulated per
// step) and dp 4, sharded over the whole dp group and over shard groups of 2, takes the steps of
// one rank at zero 0: the same losses and the same parameters after 20 steps, clipping included.
// Llama, not GPT-2: GPT-2's key bias has an exactly zero true gradient (softmax ignores a constant
// added to a row of scores), so its computed gradient is rounding noise that depends on the
// summation order, and Adam turns it into ±lr steps: GPT-2's parameters differ by ~1e-4 between
// dp 1 and dp 4 at zero 0 already. Llama's differ by ~4e-7 (zero 0 or 1). tests/e2e/dp.sh checks
// GPT-2 on real text, where the criterion holds.
class ZeroTest : public TrainStepTest {
 protected:
  void SetUp() override {
    TrainStepTest::SetUp();
    Recipe& r = recipe_;
    r.model.hidden = 64, r.model.heads = 4, r.model.kv_heads = 2, r.model.ffn_hidden = 128;
    r.model.tie_embeddings = true;
    r.train.steps = 20, r.optimizer.decay_steps = 20;
    r.train.grad_clip = 0.5;  // clips most steps: the norm over shards matters
  }

  struct Run {
    std::vector<float> losses;
    std::vector<float> params;  // dp rank 0's, after the last step
    int64_t grad_bytes = 0;     // rank 0's gradient sync: bytes its collectives moved
  };

  // Steps [from, to) at (zero, dp, zero_group), every rank checked against rank 0. `load`: a
  // checkpoint to start from; `save`: where to write one after the last step.
  Run run(int zero, int dp, int zero_group, int from, int to, const std::string& load = "",
          const std::string& save = "") {
    Recipe r = recipe_;
    r.parallel.zero = zero, r.parallel.dp = dp, r.parallel.zero_group = zero_group;
    std::vector<Run> runs(static_cast<size_t>(dp));
    std::vector<float> whole;  // zero 3
    parallel::run_ranks_in_threads(dp, [&](parallel::Comm& world) {
      const int rank = world.rank();
      Rank me(r, prefix_, world.split(0, rank, "world"), dp);
      auto slices = [&] {
        return checkpoint_slices(me.model, &me.step->optimizer(), me.comms.dp->rank() == 0,
                                 me.step->grad_sync().first_copy());
      };
      if (!load.empty()) {
        LoadedCheckpoint c = checkpoint_load(load, slices(), *me.comms.world);
        EXPECT_EQ(c.manifest.step, from);
        me.step->restore(c.manifest.extra, from);
        me.step->params_from_master();  // 16-bit: the loaded fp32 master into the parameters
      }
      for (int s = from; s < to; ++s)
        runs[size_t(rank)].losses.push_back(me.step->run(s, int64_t(s) * r.train.global_batch).loss);
      runs[size_t(rank)].grad_bytes = me.step->grad_sync().stats().bytes;
      if (zero < 3) {
        runs[size_t(rank)].params = me.params_fp32();
      } else {  // the first shard group's owned shards, assembled (they cover the model once)
        world.barrier();
        if (rank == 0) whole.assign(size_t(me.model.numel()), NAN);
        world.barrier();
        if (me.step->grad_sync().first_copy()) {
          // The model's shard, or with offload_params the optimizer's store.
          std::vector<float> stored(size_t(me.step->optimizer().owned_numel()));
          if (!me.model.param_shard().defined())
            me.step->optimizer().read_state(AdamW::State::master, 0,
                                            kernels::host_tensor(stored.data(), {int64_t(stored.size())}));
          const float* values = me.model.param_shard().defined() ? me.model.param_shard().ptr<float>() : stored.data();
          int64_t at = 0;
          for (const parallel::FlatRange& o : me.model.param_shard_ranges())
            for (int64_t i = o.begin; i < o.end; ++i) whole[size_t(i)] = values[at++];
        }
        world.barrier();
      }
      if (!save.empty()) {
        CheckpointMeta meta;
        meta.step = to;
        meta.consumed_samples = int64_t(to) * r.train.global_batch;
        meta.extra = me.step->state();
        meta.recipe_yaml = "name: zero\n";
        meta.tokenizer_kind = "byte";
        meta.mesh = {1, 1, dp, zero, zero > 0 ? (zero_group > 0 ? zero_group : dp) : 0};
        checkpoint_save(default_file_system(), save, meta, slices(), *me.comms.world, 3);
      }
    });
    if (zero == 3) {
      for (float v : whole) EXPECT_FALSE(std::isnan(v)) << "an element no rank owns";
      for (Run& one : runs) one.params = whole;
    }
    for (int rank = 1; rank < dp; ++rank) {
      EXPECT_EQ(runs[size_t(rank)].losses, runs[0].losses) << "rank " << rank;
      EXPECT_EQ(runs[size_t(rank)].params, runs[0].params) << "rank " << rank << " diverged";
    }
    return runs[0];
  }

  static void expect_same(const Run& got, const Run& want, size_t want_from = 0) {
    ASSERT_EQ(got.losses.size() + want_from, want.losses.size());
    for (size_t s = 0; s < got.losses.size(); ++s)
      EXPECT_LE(std::abs(got.losses[s] - want.losses[want_from + s]), 1e-5 * std::abs(want.losses[want_from + s]))
          << "step " << want_from + s + 1;
    if (want.params.empty()) return;
    EXPECT_LE(rel_diff(kernels::host_tensor(const_cast<float*>(got.params.data()), {int64_t(got.params.size())}),
                       kernels::host_tensor(const_cast<float*>(want.params.data()), {int64_t(want.params.size())})),
              1e-5);
  }
};

TEST_F(ZeroTest, StageOneTakesTheStepsOfOneRank) {
  const Run want = run(0, 1, 0, 0, 20);
  EXPECT_LT(want.losses.back(), want.losses.front());
  // bucket_mb 25: the whole model is one sharding unit; 0.01: about one unit per block.
  for (auto [dp, group, mb] : {std::tuple{2, 0, 25.0}, std::tuple{4, 0, 25.0}, std::tuple{4, 2, 25.0},
                               std::tuple{2, 0, 0.01}, std::tuple{4, 2, 0.01}}) {
    SCOPED_TRACE(::testing::Message() << "dp " << dp << " zero_group " << group << " bucket_mb " << mb);
    recipe_.parallel.bucket_mb = mb;
    expect_same(run(1, dp, group, 0, 20), want);
  }
}

// ZeRO stage 2: gradients reduce-scattered per micro-batch into the owned shard, at dp 2 (two
// micro-batches of 2 per rank) and dp 4 (two micro-batches of 1), one unit or about one per block,
// hybrid too: the steps of one rank at zero 0.
TEST_F(ZeroTest, StageTwoTakesTheStepsOfOneRank) {
  const Run want = run(0, 1, 0, 0, 20);
  for (auto [dp, group, mb, micro] :
       {std::tuple{2, 0, 25.0, 2}, std::tuple{2, 0, 0.01, 2}, std::tuple{4, 0, 0.01, 1}, std::tuple{4, 2, 0.01, 1}}) {
    SCOPED_TRACE(::testing::Message() << "dp " << dp << " zero_group " << group << " bucket_mb " << mb
                                      << " micro_batch " << micro);
    recipe_.parallel.bucket_mb = mb;
    recipe_.train.micro_batch = micro;
    expect_same(run(2, dp, group, 0, 20), want);
  }
}

// ZeRO stage 3: parameters sharded too, each group's values gathered before forward and backward
// read them; at dp 2 (two micro-batches of 2 per rank) and dp 4 (two of 1), one unit or about one
// per block, hybrid, and with activation recomputation: the steps of one rank at zero 0.
TEST_F(ZeroTest, StageThreeTakesTheStepsOfOneRank) {
  const Run want = run(0, 1, 0, 0, 20);
  using AC = ActivationCheckpointing;
  for (auto [dp, group, mb, micro, ckpt] : {std::tuple{2, 0, 25.0, 2, AC::none}, std::tuple{2, 0, 0.01, 2, AC::full},
                                            std::tuple{2, 0, 0.01, 2, AC::selective},
                                            std::tuple{4, 0, 0.01, 1, AC::none}, std::tuple{4, 2, 0.01, 1, AC::none}}) {
    SCOPED_TRACE(::testing::Message() << "dp " << dp << " zero_group " << group << " bucket_mb " << mb
                                      << " micro_batch " << micro << " recompute " << to_string(ckpt));
    recipe_.parallel.bucket_mb = mb;
    recipe_.train.micro_batch = micro;
    recipe_.train.activation_checkpointing = ckpt;
    expect_same(run(3, dp, group, 0, 20), want);
  }
}

// Each rank writes the values of the element ranges it owns; they load at zero 0 on one rank, and
// the reverse.
TEST_F(ZeroTest, CheckpointsMoveBetweenZeroThreeAndZeroZero) {
  const Run want = run(0, 1, 0, 0, 20);
  const std::string sharded = (dir_ / "ckpt_zero3").string(), whole = (dir_ / "ckpt_zero0").string();
  recipe_.parallel.bucket_mb = 0.01;
  recipe_.train.micro_batch = 1;  // two micro-batches per rank at dp 4
  // Written at (zero 3, dp 4), resumed at (zero 0, dp 1).
  expect_same(run(3, 4, 0, 0, 10, "", sharded), {{want.losses.begin(), want.losses.begin() + 10}, {}}, 0);
  recipe_.train.micro_batch = 2;
  expect_same(run(0, 1, 0, 10, 20, sharded + "/step_00000010"), want, 10);
  // Written at (zero 0, dp 1), resumed at (zero 3, dp 4).
  run(0, 1, 0, 0, 10, "", whole);
  recipe_.train.micro_batch = 1;
  expect_same(run(3, 4, 0, 10, 20, whole + "/step_00000010"), want, 10);
}

TEST_F(ZeroTest, CheckpointsMoveBetweenZeroTwoAndZeroZero) {
  const Run want = run(0, 1, 0, 0, 20);
  const std::string sharded = (dir_ / "ckpt_zero2").string(), whole = (dir_ / "ckpt_zero0").string();
  recipe_.parallel.bucket_mb = 0.01;
  recipe_.train.micro_batch = 1;  // two micro-batches per rank at dp 4
  // Written at (zero 2, dp 4), resumed at (zero 0, dp 1).
  expect_same(run(2, 4, 0, 0, 10, "", sharded), {{want.losses.begin(), want.losses.begin() + 10}, {}}, 0);
  recipe_.train.micro_batch = 2;
  expect_same(run(0, 1, 0, 10, 20, sharded + "/step_00000010"), want, 10);
  // Written at (zero 0, dp 1), resumed at (zero 2, dp 4, zero_group 2).
  run(0, 1, 0, 0, 10, "", whole);
  recipe_.train.micro_batch = 1;
  expect_same(run(2, 4, 2, 10, 20, whole + "/step_00000010"), want, 10);
}

// A non-finite gradient shows in the norm over shards on every rank: all skip the step together,
// before the update and the gather.
TEST_F(ZeroTest, NonFiniteStepsAreSkippedOnEveryShard) {
  recipe_.train.on_nonfinite = NonFiniteAction::skip;
  recipe_.parallel.dp = 2;
  for (int zero : {1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << "zero " << zero);
    recipe_.parallel.zero = zero;
    parallel::run_ranks_in_threads(2, [&](parallel::Comm& world) {
      Rank me(recipe_, prefix_, world.split(0, world.rank(), "world"), 2);
      // Element 5, in the embedding, owned by rank 0 only (at zero 3 only rank 0 holds it).
      if (zero < 3)
        me.model.params().ptr<float>()[5] = NAN;
      else if (me.model.param_shard_offset(5) >= 0)
        me.model.param_shard().ptr<float>()[me.model.param_shard_offset(5)] = NAN;
      const kernels::Tensor p = me.values();
      const std::vector<float> before(p.ptr<float>(), p.ptr<float>() + p.numel());
      const StepOutcome o = me.step->run(0, 0);
      EXPECT_TRUE(o.skipped);
      EXPECT_EQ(me.step->optimizer().steps(), 0);
      EXPECT_EQ(0, std::memcmp(before.data(), p.data, before.size() * 4)) << "a skipped step updated";
    });
  }
}

TEST_F(ZeroTest, CheckpointsMoveBetweenZeroOneAndZeroZero) {
  const Run want = run(0, 1, 0, 0, 20);
  const std::string sharded = (dir_ / "ckpt_zero1").string(), whole = (dir_ / "ckpt_zero0").string();
  // Written at (zero 1, dp 4), resumed at (zero 0, dp 1).
  expect_same(run(1, 4, 0, 0, 10, "", sharded), {{want.losses.begin(), want.losses.begin() + 10}, {}}, 0);
  expect_same(run(0, 1, 0, 10, 20, sharded + "/step_00000010"), want, 10);
  // Written at (zero 0, dp 1), resumed at (zero 1, dp 4, zero_group 2).
  run(0, 1, 0, 0, 10, "", whole);
  expect_same(run(1, 4, 2, 10, 20, whole + "/step_00000010"), want, 10);
}

// 16-bit storage (bf16, and fp16 with its loss scaler) with the optimizer's fp32 master: one rank
// takes fp32's steps within 1% (loss per step), ZeRO 1 and 2 at dp 2 take the steps of one rank
// within 16-bit rounding, and a run resumed from a checkpoint continues BITWISE (losses and
// parameters) where the uninterrupted run of the same layout is, at (zero 0, dp 1), (zero 1, dp 2)
// and (zero 2, dp 2); the checkpoint holds the fp32 master.
TEST_F(ZeroTest, SixteenBitStorageTrainsShardedAndResumesBitwise) {
  const Run fp32 = run(0, 1, 0, 0, 20);
  for (const Precision precision : {Precision::bf16, Precision::fp16}) {
    SCOPED_TRACE(to_string(precision));
    recipe_.train.precision = precision;
    recipe_.train.loss_scale = {.initial = 1024, .growth_interval = 4, .backoff = 0.5, .hysteresis = 2};
    const Run want = run(0, 1, 0, 0, 20);
    for (size_t s = 0; s < want.losses.size(); ++s)
      EXPECT_NEAR(want.losses[s], fp32.losses[s], 1e-2 * fp32.losses[s]) << "step " << s + 1;
    const Run sharded = run(1, 2, 0, 0, 20);
    for (size_t s = 0; s < want.losses.size(); ++s)
      EXPECT_NEAR(sharded.losses[s], want.losses[s], 2e-2 * want.losses[s]) << "step " << s + 1;
    // ZeRO 2: 16-bit gradients in the pool, reduced and widened into the fp32 owned shard; ZeRO 3:
    // also the fp32 owned values (the master) rounded into 16-bit pool slots and gathered.
    const Run stage2 = run(2, 2, 0, 0, 20), stage3 = run(3, 2, 0, 0, 20);
    for (size_t s = 0; s < want.losses.size(); ++s) {
      EXPECT_NEAR(stage2.losses[s], want.losses[s], 2e-2 * want.losses[s]) << "zero 2, step " << s + 1;
      EXPECT_NEAR(stage3.losses[s], want.losses[s], 2e-2 * want.losses[s]) << "zero 3, step " << s + 1;
    }
    for (auto [zero, dp, whole] :
         {std::tuple{0, 1, &want}, std::tuple{1, 2, &sharded}, std::tuple{2, 2, &stage2}, std::tuple{3, 2, &stage3}}) {
      SCOPED_TRACE(::testing::Message() << "zero " << zero << " dp " << dp);
      const std::string ckpt = (dir_ / fmt::format("ckpt_{}_{}", to_string(precision), zero)).string();
      run(zero, dp, 0, 0, 10, "", ckpt);
      const Run resumed = run(zero, dp, 0, 10, 20, ckpt + "/step_00000010");
      EXPECT_EQ(resumed.losses, std::vector<float>(whole->losses.begin() + 10, whole->losses.end()));
      EXPECT_EQ(resumed.params, whole->params);
    }
  }
}

// parallel.offload: nvme keeps the optimizer's state (moments, and the fp32 master with bf16) in a
// file per rank, updated a unit at a time through the I/O thread: the losses and parameters are
// BITWISE those of the same layout without offload, at dp 1 (fp32, and bf16 with its master), at
// dp 2 with ZeRO 1 (fp32 and bf16), ZeRO 2 and ZeRO 3, and at ZeRO 3 with offload_params (the owned
// values in the file too, read as each unit is gathered; fp32 and bf16, one unit per block). The
// small model's state spans several units.
TEST_F(ZeroTest, NvmeOffloadTakesTheSameStepsBitwise) {
  recipe_.train.steps = 8, recipe_.optimizer.decay_steps = 8;
  for (auto [zero, dp, precision, params] :
       {std::tuple{0, 1, Precision::fp32, false}, std::tuple{0, 1, Precision::bf16, false},
        std::tuple{1, 2, Precision::fp32, false}, std::tuple{1, 2, Precision::bf16, false},
        std::tuple{2, 2, Precision::fp32, false}, std::tuple{3, 2, Precision::fp32, false},
        std::tuple{3, 2, Precision::fp32, true}, std::tuple{3, 2, Precision::bf16, true}}) {
    SCOPED_TRACE(::testing::Message() << "zero " << zero << " dp " << dp << " " << to_string(precision)
                                      << (params ? " offload_params" : ""));
    recipe_.train.precision = precision;
    recipe_.parallel.bucket_mb = params ? 0.01 : 25.0;
    recipe_.parallel.offload = OffloadKind::none, recipe_.parallel.offload_path.clear();
    recipe_.parallel.offload_params = false;
    const Run want = run(zero, dp, 0, 0, 8);
    recipe_.parallel.offload = OffloadKind::nvme, recipe_.parallel.offload_path = (dir_ / "offload").string();
    recipe_.parallel.offload_params = params;
    const Run got = run(zero, dp, 0, 0, 8);
    EXPECT_EQ(got.losses, want.losses);
    EXPECT_EQ(got.params, want.params);
    EXPECT_LT(got.losses.back(), got.losses.front());
  }
  // Scratch: each file is unlinked once open, and nothing is left behind.
  EXPECT_TRUE(fs::is_empty(dir_ / "offload"));
}

// A checkpoint written with offload holds the whole optimizer state (read from the files): a run
// without offload resumes from it BITWISE where the uninterrupted run is, and the reverse (the
// checkpoint's state written into the files); bf16 at ZeRO 1, dp 2, so the master moves too.
TEST_F(ZeroTest, CheckpointsMoveBetweenOffloadAndNot) {
  recipe_.train.precision = Precision::bf16;
  const Run want = run(1, 2, 0, 0, 20);
  const std::string offloaded = (dir_ / "ckpt_offloaded").string(), in_memory = (dir_ / "ckpt_in_memory").string();
  auto offload = [&](bool on) {
    recipe_.parallel.offload = on ? OffloadKind::nvme : OffloadKind::none;
    recipe_.parallel.offload_path = on ? (dir_ / "offload").string() : "";
  };
  const std::vector<float> tail(want.losses.begin() + 10, want.losses.end());
  offload(true);
  run(1, 2, 0, 0, 10, "", offloaded);
  offload(false);
  Run resumed = run(1, 2, 0, 10, 20, offloaded + "/step_00000010");
  EXPECT_EQ(resumed.losses, tail);
  EXPECT_EQ(resumed.params, want.params);
  run(1, 2, 0, 0, 10, "", in_memory);
  offload(true);
  resumed = run(1, 2, 0, 10, 20, in_memory + "/step_00000010");
  EXPECT_EQ(resumed.losses, tail);
  EXPECT_EQ(resumed.params, want.params);
}

// parallel.grad_reduce_dtype: bf16 moves the bf16 gradient words and sums them in bf16. Over two
// ranks that is the same arithmetic as summing in fp32 (one addition, rounded once either way; the
// division by 2 is exact), so the runs are bitwise equal while the gradient reductions move half the
// bytes; over four ranks each partial sum is rounded, and the losses stay within bf16's rounding.
TEST_F(ZeroTest, Bf16GradientReductionMovesHalfTheBytes) {
  recipe_.train.precision = Precision::bf16;
  for (const int zero : {0, 2}) {
    SCOPED_TRACE(::testing::Message() << "zero " << zero);
    const Run wide = run(zero, 2, 0, 0, 6);
    recipe_.parallel.grad_reduce_dtype = GradReduceDtype::bf16;
    const Run narrow = run(zero, 2, 0, 0, 6);
    recipe_.parallel.grad_reduce_dtype = GradReduceDtype::fp32;
    EXPECT_EQ(narrow.losses, wide.losses);
    EXPECT_EQ(narrow.params, wide.params);
    // Stage 0 all-reduces only gradients; stage 2 also all-gathers the bf16 parameters, the same
    // bytes either way.
    if (zero == 0) {
      EXPECT_EQ(2 * narrow.grad_bytes, wide.grad_bytes);
    } else {
      EXPECT_LT(narrow.grad_bytes, wide.grad_bytes);
    }
  }
  const Run wide = run(1, 4, 0, 0, 6);
  recipe_.parallel.grad_reduce_dtype = GradReduceDtype::bf16;
  const Run narrow = run(1, 4, 0, 0, 6);
  for (size_t s = 0; s < wide.losses.size(); ++s)
    EXPECT_NEAR(narrow.losses[s], wide.losses[s], 1e-2 * wide.losses[s]) << "step " << s + 1;
}

}  // namespace
}  // namespace llmtrain::trainer
