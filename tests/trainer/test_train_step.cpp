// One optimizer step as a unit (trainer/train_step.h), on a real dataset file and a real model:
// data-parallel ranks (as threads, on the in-process communicator) take the same steps as one rank,
// a warm step allocates nothing, non-finite steps are skipped or stop the run, and parameter groups
// reach the gradient sync in the order backward completes them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "parallel/comm_threads.h"
#include "tests/common/count_allocations.h"
#include "trainer/data/indexed_dataset.h"
#include "trainer/memory.h"
#include "trainer/train_step.h"

namespace llmtrain::trainer {
namespace {
namespace fs = std::filesystem;

class TrainStepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("train_step_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    prefix_ = (dir_ / "data").string();
    IndexedDatasetWriter w(prefix_, TokenDtype::uint16);
    std::mt19937 rng(3);
    for (int d = 0; d < 40; ++d) {
      std::vector<int32_t> doc(size_t(20 + rng() % 30));
      for (auto& t : doc) t = int32_t(rng() % 60);
      w.add_document(doc);
    }
    w.close();
    w.commit();

    Recipe& r = recipe_;
    r.model.family = ModelFamily::llama;
    r.model.layers = 2, r.model.hidden = 32, r.model.heads = 4, r.model.kv_heads = 2, r.model.ffn_hidden = 64;
    r.model.vocab = 60, r.model.vocab_pad = 32, r.model.seq_len = 12, r.model.max_positions = 12;
    r.model.init_std = 0.1, r.model.tie_embeddings = true;
    r.train.micro_batch = 2, r.train.global_batch = 8, r.train.steps = 10, r.train.grad_clip = 1.0;
    r.optimizer.lr = 1e-2, r.optimizer.warmup = 2, r.optimizer.decay_steps = 10;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A rank's whole training set-up, as train() builds it.
  struct Rank {
    Rank(const Recipe& r, const std::string& prefix, std::unique_ptr<parallel::Comm> world, int dp)
        : mesh({1, 1, dp}, world->rank()),
          comms(parallel::make_mesh_comms(mesh, std::move(world))),
          data({{prefix, 1.0}}, r.model.seq_len, 7, r.model.vocab),
          sampler(r.train.global_batch, r.train.micro_batch, comms.dp->rank(), dp),
          batches(data, sampler, r.model.seq_len),
          schedule(step_schedule(r, 0, sampler.micro_batches_per_step())),
          model(r.model, step_model_options(r, 0, schedule), *comms.tp) {
      model.init_parameters(11);
      step.emplace(r, model, comms, batches, schedule);
    }
    parallel::Mesh mesh;
    parallel::MeshComms comms;
    GptDataset data;
    Sampler sampler;
    MicroBatchReader batches;
    std::vector<parallel::PipeOp> schedule;
    Model model;
    std::optional<TrainStep> step;
  };

  fs::path dir_;
  std::string prefix_;
  Recipe recipe_;
};

double rel_diff(const kernels::Tensor& a, const kernels::Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.ptr<float>()[i], y = b.ptr<float>()[i];
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / den);
}

TEST_F(TrainStepTest, DataParallelRanksTakeTheStepsOfOneRank) {
  recipe_.parallel.dp = 1;
  Rank one(recipe_, prefix_, parallel::make_local_comm(), 1);
  std::vector<StepOutcome> want;
  for (int s = 0; s < 4; ++s) want.push_back(one.step->run(s, int64_t(s) * recipe_.train.global_batch));

  Recipe r2 = recipe_;
  r2.parallel.dp = 2;
  std::vector<float> params[2];
  std::vector<StepOutcome> got[2];
  parallel::run_ranks_in_threads(2, [&](parallel::Comm& world) {
    const int rank = world.rank();
    Rank me(r2, prefix_, world.split(0, rank, "world"), 2);
    for (int s = 0; s < 4; ++s) got[rank].push_back(me.step->run(s, int64_t(s) * r2.train.global_batch));
    const kernels::Tensor p = me.model.params();
    params[rank].assign(p.ptr<float>(), p.ptr<float>() + p.numel());
  });
  for (int rank = 0; rank < 2; ++rank) {
    for (int s = 0; s < 4; ++s) {
      EXPECT_NEAR(got[rank][s].loss, want[size_t(s)].loss, 1e-5 * want[size_t(s)].loss) << "rank " << rank;
      EXPECT_NEAR(got[rank][s].grad_norm, want[size_t(s)].grad_norm, 1e-5 * want[size_t(s)].grad_norm);
      EXPECT_EQ(got[rank][s].lr, want[size_t(s)].lr);
    }
    EXPECT_LE(rel_diff(kernels::host_tensor(params[rank].data(), {int64_t(params[rank].size())}), one.model.params()),
              1e-5)
        << "rank " << rank;
  }
  EXPECT_EQ(params[0], params[1]) << "the replicas diverged";
  EXPECT_LT(want.back().loss, want.front().loss) << "four steps should lower the loss";
}

TEST_F(TrainStepTest, AWarmStepAllocatesNothing) {
  Rank one(recipe_, prefix_, parallel::make_local_comm(), 1);
  one.step->run(0, 0);
  one.step->run(1, recipe_.train.global_batch);
  g_allocations = 0;
  g_counting = true;
  one.step->run(2, 2 * recipe_.train.global_batch);
  g_counting = false;
  EXPECT_EQ(g_allocations.load(), 0);
}

TEST_F(TrainStepTest, NonFiniteStepsAreSkippedOrStopTheRun) {
  recipe_.train.on_nonfinite = NonFiniteAction::skip;
  recipe_.train.max_skipped_steps = 1;
  Rank one(recipe_, prefix_, parallel::make_local_comm(), 1);
  one.model.params().ptr<float>()[5] = NAN;  // in the embedding: every loss is NaN
  std::vector<float> before(one.model.params().ptr<float>(),
                            one.model.params().ptr<float>() + one.model.params().numel());
  StepOutcome o = one.step->run(0, 0);
  EXPECT_TRUE(o.skipped);
  EXPECT_EQ(o.skipped_total, 1);
  EXPECT_EQ(one.step->optimizer().steps(), 0);
  EXPECT_EQ(0, std::memcmp(before.data(), one.model.params().data, before.size() * 4)) << "a skipped step updated";
  EXPECT_EQ(one.step->state(), (nlohmann::json{{"skipped_total", 1}, {"skipped_in_a_row", 1}}));
  EXPECT_THAT([&] { one.step->run(1, 8); },
              ::testing::ThrowsMessage<Error>(::testing::HasSubstr("2 non-finite steps in a row")));

  recipe_.train.on_nonfinite = NonFiniteAction::stop;
  Rank stops(recipe_, prefix_, parallel::make_local_comm(), 1);
  stops.model.params().ptr<float>()[5] = NAN;
  EXPECT_THAT([&] { stops.step->run(0, 0); },
              ::testing::ThrowsMessage<Error>(::testing::HasSubstr("non-finite loss at step 1")));
}

// The memory account: what the plan says a rank allocates, computed without allocating, is what the
// allocator counts once the rank's model, optimizer and step exist, kind by kind.
TEST_F(TrainStepTest, TheMemoryPlanIsWhatARankAllocates) {
  for (auto ckpt : {ActivationCheckpointing::none, ActivationCheckpointing::full}) {
    recipe_.train.activation_checkpointing = ckpt;
    recipe_.parallel.dp = 1;
    const MemoryAccount plan = memory_plan(recipe_, {0, 0, 0});
    Rank one(recipe_, prefix_, parallel::make_local_comm(), 1);
    one.step->run(0, 0);
    const MemoryAccount got = memory_measured(kernels::Device::cpu, false);
    EXPECT_EQ(got.parameters, plan.parameters);
    EXPECT_EQ(got.gradients, plan.gradients);
    EXPECT_EQ(got.optimizer, plan.optimizer);
    EXPECT_EQ(got.activations, plan.activations);
    EXPECT_EQ(got.communication, plan.communication);
    EXPECT_EQ(plan.parameters, one.model.numel() * 4);
    EXPECT_EQ(plan.optimizer, 2 * plan.parameters);  // AdamW's two moments, unsharded at zero 0
    EXPECT_TRUE(plan.notes.empty());
  }
  recipe_.train.precision = Precision::bf16;
  recipe_.parallel.zero = 1;
  EXPECT_THAT(memory_plan(recipe_, {0, 0, 0}).notes,
              ::testing::ElementsAre(::testing::HasSubstr("train.precision bf16 is not supported yet"),
                                     ::testing::HasSubstr("parallel.zero 1 is not supported yet")));
}

TEST_F(TrainStepTest, GradientGroupsFollowBackward) {
  Rank one(recipe_, prefix_, parallel::make_local_comm(), 1);
  const auto groups = grad_ready_groups(one.model);
  ASSERT_EQ(groups.size(), 4u);  // head, block 1, block 0, embedding
  auto names = [&](int g) {
    std::vector<std::string> out;
    for (int i : groups[size_t(g)]) out.push_back(one.model.parameters()[size_t(i)].spec.name);
    return out;
  };
  EXPECT_THAT(names(0), ::testing::ElementsAre("model.norm.weight"));
  EXPECT_THAT(names(1), ::testing::Each(::testing::StartsWith("model.layers.1.")));
  EXPECT_THAT(names(2), ::testing::Each(::testing::StartsWith("model.layers.0.")));
  EXPECT_THAT(names(3), ::testing::ElementsAre("model.embed_tokens.weight"));  // tied: the head's too
  size_t total = 0;
  for (const auto& g : groups) total += g.size();
  EXPECT_EQ(total, one.model.parameters().size());
}

}  // namespace
}  // namespace llmtrain::trainer
