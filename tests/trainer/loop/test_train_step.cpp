// One optimizer step as a unit (trainer/loop/train_step.h), on a real dataset file and a real model:
// data-parallel ranks (as threads, on the in-process communicator) take the same steps as one rank,
// pipeline stages take the steps of one rank, a warm step allocates nothing, fp16's loss scaler
// skips overflow steps, non-finite steps are skipped or stop the run, and parameter groups reach the
// gradient sync in the order backward completes them (ZeRO: test_train_zero.cpp).
#include "common/error.h"
#include "tests/common/test_layout.h"
#include "tests/trainer/loop/train_step_fixture.h"
#include "trainer/loop/op_profiler.h"
#include "trainer/loop/step_timer.h"

namespace llmtrain::trainer {
namespace {

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

// Pipeline stages (thread ranks): a 4-layer Llama with tied and untied embeddings at pp 2 and 4, GPipe and
// 1F1B, pp 2 × dp 2 with ZeRO 1, and uneven splits (1 + 3 blocks, 1 + 2 + 1), takes the steps of one rank: the same
// losses and gradient norms on every rank, and each stage's parameters (the last stage's copy of the tied embedding
// included) those of one rank, after 6 steps.
TEST_F(TrainStepTest, PipelineStagesTakeTheStepsOfOneRank) {
  for (const bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied embeddings" : "untied embeddings");
    recipe_.model.tie_embeddings = tied;
    recipe_.model.layers = 4;
    check_pipeline_layouts(
        {Layout{2, 1, 0, PipelineSchedule::gpipe, {}}, Layout{2, 1, 0, PipelineSchedule::one_f_one_b, {}},
         Layout{4, 1, 0, PipelineSchedule::gpipe, {}}, Layout{4, 1, 0, PipelineSchedule::one_f_one_b, {}},
         Layout{2, 2, 1, PipelineSchedule::one_f_one_b, {}}, Layout{2, 1, 0, PipelineSchedule::one_f_one_b, {1, 3}},
         Layout{3, 1, 0, PipelineSchedule::gpipe, {1, 2, 1}}});
  }
}

// The interleaved schedule (thread ranks) on an 8-layer Llama with a tied embedding: pp 2 with two
// virtual chunks (stage 0 holds blocks 0-1 and 4-5), pp 4 with two (one block per chunk), and pp 2
// × dp 2 with ZeRO 1 (the gradient groups of both chunks reach the sync), take the steps of one rank.
TEST_F(TrainStepTest, InterleavedStagesTakeTheStepsOfOneRank) {
  recipe_.model.layers = 8;
  check_pipeline_layouts({Layout{2, 1, 0, PipelineSchedule::interleaved, {}, 2},
                          Layout{4, 1, 0, PipelineSchedule::interleaved, {}, 2},
                          Layout{2, 2, 1, PipelineSchedule::interleaved, {}, 2}});
}

// ZB-H1 (thread ranks), backward split into input and weight halves, on the same 8-layer Llama:
// pp 2, pp 4, and pp 2 × dp 2 with ZeRO 1 (the grad-ready hooks fire from the weight halves), take
// the steps of one rank.
TEST_F(TrainStepTest, ZeroBubbleStagesTakeTheStepsOfOneRank) {
  recipe_.model.layers = 8;
  check_pipeline_layouts({Layout{2, 1, 0, PipelineSchedule::zero_bubble, {}},
                          Layout{4, 1, 0, PipelineSchedule::zero_bubble, {}},
                          Layout{2, 2, 1, PipelineSchedule::zero_bubble, {}}});
}

// MoE blocks (a dense first layer, then 4 experts, top 2) at pp 2 with 1F1B, interleaved pp 2 × 2
// chunks, zero bubble (a MoE block's whole backward in the input half), and pp 2 × dp 2 with ZeRO 1
// take the steps of one rank; every rank reports every block's
// routing, the same numbers as one rank.
TEST_F(TrainStepTest, MoeStagesTakeTheStepsOfOneRank) {
  recipe_.model.layers = 4;
  recipe_.model.moe = {.experts = 4, .top_k = 2, .ffn_hidden = 32, .first_dense = 1, .aux_loss = 0.1, .z_loss = 0.01};
  check_pipeline_layouts(
      {Layout{2, 1, 0, PipelineSchedule::one_f_one_b, {}}, Layout{2, 1, 0, PipelineSchedule::interleaved, {}, 2},
       Layout{2, 1, 0, PipelineSchedule::zero_bubble, {}}, Layout{2, 2, 1, PipelineSchedule::one_f_one_b, {}}});
}

// A step's MoE routing: each block's picks add up to the step's tokens × top_k, the auxiliary losses
// are in their ranges, nothing drops without a capacity; a capacity drops, and dp 2 reports the same
// as one rank. The memory plan is what a MoE
// rank allocates.
TEST_F(TrainStepTest, MoeRoutingIsInTheStepOutcome) {
  recipe_.model.layers = 3;
  recipe_.model.moe = {.experts = 4, .top_k = 2, .ffn_hidden = 32, .every = 2, .aux_loss = 0.1, .z_loss = 0.01};
  recipe_.parallel.dp = 1;
  const MemoryAccount plan = memory_plan(recipe_, test_layout(recipe_), {0, 0, 0});
  Rank one(recipe_, prefix_, parallel::make_local_comm(), 1);
  const StepOutcome o = one.step->run(0, 0);
  const MemoryAccount got = memory_measured(kernels::Device::cpu, false);
  EXPECT_EQ(got.activations, plan.activations);
  EXPECT_EQ(got.parameters, plan.parameters);
  ASSERT_EQ(o.moe.size(), 2u);  // layers 0 and 2
  EXPECT_EQ(o.moe[0].layer, 0);
  EXPECT_EQ(o.moe[1].layer, 2);
  const double picks = double(recipe_.train.global_batch) * recipe_.model.seq_len * 2;
  for (const MoeLayerStats& l : o.moe) {
    ASSERT_EQ(l.tokens.size(), 4u);
    EXPECT_EQ(l.tokens[0] + l.tokens[1] + l.tokens[2] + l.tokens[3], picks);
    EXPECT_EQ(l.dropped, 0);
    // aux = coef · E · Σ f·P with f and P on the simplex: in (0, coef · E].
    EXPECT_GT(l.aux_loss, 0);
    EXPECT_LE(l.aux_loss, 0.1 * 4);
    EXPECT_GT(l.z_loss, 0);
  }
  recipe_.model.moe.capacity_factor = 0.5;
  Rank capped(recipe_, prefix_, parallel::make_local_comm(), 1);
  const StepOutcome c = capped.step->run(0, 0);
  for (const MoeLayerStats& l : c.moe) EXPECT_GT(l.dropped, 0) << "layer " << l.layer;
  Recipe r2 = recipe_;
  r2.parallel.dp = 2;
  std::vector<StepOutcome> got2(2);
  parallel::run_ranks_in_threads(2, [&](parallel::Comm& world) {
    Rank me(r2, prefix_, world.split(0, world.rank(), "world"), 2);
    got2[size_t(world.rank())] = me.step->run(0, 0);
  });
  for (const StepOutcome& g : got2) {
    ASSERT_EQ(g.moe.size(), c.moe.size());
    for (size_t i = 0; i < c.moe.size(); ++i) {
      EXPECT_EQ(g.moe[i].tokens, c.moe[i].tokens);
      EXPECT_EQ(g.moe[i].dropped, c.moe[i].dropped);
      EXPECT_NEAR(g.moe[i].aux_loss, c.moe[i].aux_loss, 1e-6 * c.moe[i].aux_loss);
      EXPECT_NEAR(g.moe[i].z_loss, c.moe[i].z_loss, 1e-6 * c.moe[i].z_loss);
    }
  }
}

void TrainStepTest::check_pipeline_layouts(const std::vector<Layout>& layouts) {
  recipe_.parallel.dp = 1;
  Rank one(recipe_, prefix_, parallel::make_local_comm(), 1);
  constexpr int kSteps = 6;
  std::vector<StepOutcome> want;
  for (int s = 0; s < kSteps; ++s) want.push_back(one.step->run(s, int64_t(s) * recipe_.train.global_batch));

  for (const Layout& l : layouts) {
    SCOPED_TRACE(fmt::format("pp {} dp {} zero {} {} blocks {} v {}", l.pp, l.dp, l.zero, to_string(l.schedule),
                             l.blocks.size(), l.virtual_stages));
    Recipe r = recipe_;
    r.parallel.pp = l.pp, r.parallel.dp = l.dp, r.parallel.zero = l.zero, r.parallel.pp_schedule = l.schedule;
    r.parallel.pp_layers = l.blocks;
    r.parallel.virtual_stages = l.virtual_stages;
    const int ranks = l.pp * l.dp;
    std::vector<std::vector<StepOutcome>> got(static_cast<size_t>(ranks));
    std::vector<double> worst(size_t(ranks), 0.0);
    std::vector<int> compared(size_t(ranks), 0);
    parallel::run_ranks_in_threads(ranks, [&](parallel::Comm& world) {
      const int rank = world.rank();
      Rank me(r, prefix_, world.split(0, rank, "world"), l.dp, l.pp);
      for (int s = 0; s < kSteps; ++s) got[size_t(rank)].push_back(me.step->run(s, int64_t(s) * r.train.global_batch));
      for (const ModelParam& p : me.model.parameters()) {
        worst[size_t(rank)] = std::max(worst[size_t(rank)], rel_diff(p.value, one.model.parameter(p.spec.name).value));
        ++compared[size_t(rank)];
      }
    });
    int params = 0;
    for (int rank = 0; rank < ranks; ++rank) {
      for (int s = 0; s < kSteps; ++s) {
        EXPECT_NEAR(got[size_t(rank)][size_t(s)].loss, want[size_t(s)].loss, 1e-5 * want[size_t(s)].loss)
            << "rank " << rank << " step " << s;
        EXPECT_NEAR(got[size_t(rank)][size_t(s)].grad_norm, want[size_t(s)].grad_norm, 1e-5 * want[size_t(s)].grad_norm)
            << "rank " << rank << " step " << s;
      }
      EXPECT_LE(worst[size_t(rank)], 1e-5) << "rank " << rank;
      params += rank % l.dp == 0 ? compared[size_t(rank)] : 0;
    }
    // Every parameter of one rank is on some stage, and a tied embedding on two.
    EXPECT_EQ(params, int(one.model.parameters().size()) + (recipe_.model.tie_embeddings ? 1 : 0));
  }
}

// With and without the step's timer (trainer/loop/step_timer.h), which train() sets, and with the op
// profile beside it (log.profile: ops, trainer/loop/op_profiler.h): its third step is a profiled one.
TEST_F(TrainStepTest, AWarmStepAllocatesNothing) {
  enum class Observed { none, timed, profiled };
  for (const Observed observed : {Observed::none, Observed::timed, Observed::profiled})
    for (const Precision precision : {Precision::fp32, Precision::bf16}) {  // bf16: the widening scratch is warm too
      SCOPED_TRACE(fmt::format("{}{}{}", to_string(precision), observed == Observed::timed ? ", timed" : "",
                               observed == Observed::profiled ? ", timed and profiled" : ""));
      recipe_.train.precision = precision;
      recipe_.log.profile = ProfileMode::ops;
      Rank one(recipe_, prefix_, parallel::make_local_comm(), 1);
      StepTimer timer(one.model.device(), one.step->schedule());
      OpProfiler profile(recipe_.log, one.model.device());
      StepObservers both{&timer, &profile};
      if (observed == Observed::timed) one.step->set_observer(&timer);
      if (observed == Observed::profiled) one.step->set_observer(&both);
      one.step->run(0, 0);
      one.step->run(1, recipe_.train.global_batch);
      g_allocations = 0;
      g_counting = true;
      one.step->run(2, 2 * recipe_.train.global_batch);
      g_counting = false;
      EXPECT_EQ(g_allocations.load(), 0);
      EXPECT_EQ(profile.steps_timed(), observed == Observed::profiled ? 2 : 0);
    }
}

// log.profile ops: the first step is the warm-up, the next profile_steps are timed, the rest not
// observed; every timed step runs the same ops, so each row's calls are a multiple of the steps; and
// the ops' time fits in the steps'.
TEST_F(TrainStepTest, TheOpProfileTimesTheStepsAfterTheFirst) {
  recipe_.log.profile = ProfileMode::ops;
  recipe_.log.profile_steps = 2;
  Rank one(recipe_, prefix_, parallel::make_local_comm(), 1);
  OpProfiler profile(recipe_.log, one.model.device());
  ASSERT_TRUE(profile.enabled());
  one.step->set_observer(&profile);
  for (int s = 0; s < 5; ++s) {
    one.step->run(s, int64_t(s) * recipe_.train.global_batch);
    EXPECT_EQ(profile.steps_timed(), std::min(s, 2)) << "after step " << s;
  }
  const OpProfileSummary sum = profile.summary(0, 0);
  EXPECT_EQ(sum.first_step, 2);
  EXPECT_EQ(sum.steps, 2);
  EXPECT_EQ(sum.dropped, 0);
  std::set<std::string> names;
  for (const OpProfileRow& row : sum.rows) {
    names.insert(row.name);
    EXPECT_EQ(row.calls % 2, 0) << row.name;
    EXPECT_TRUE(row.inside.empty()) << row.name << " inside " << row.inside;
  }
  for (const char* op :
       {"embedding_forward", "rmsnorm_forward", "linear_forward", "rope_forward", "attention_forward", "swiglu_forward",
        "cross_entropy_forward", "attention_backward", "linear_backward", "adamw_rows", "copy"})
    EXPECT_TRUE(names.count(op)) << op;
  const double in_ops = op_profile_in_ops_seconds(sum);
  EXPECT_GT(in_ops, 0.0);
  EXPECT_LE(in_ops, sum.step_seconds);

  recipe_.log.profile = ProfileMode::none;
  EXPECT_FALSE(OpProfiler(recipe_.log, one.model.device()).enabled()) << "none: not an observer at all";
}

// fp16's dynamic loss scaling, on fp32 storage (the scaler does not depend on 16-bit tensors) and
// on fp16 storage: overflows injected into one rank's gradients (alternating ranks) at chosen
// steps skip exactly those steps on both ranks, and the scale each step uses moves by the
// hysteresis rule, with hysteresis 1 and 2; the step state a checkpoint keeps carries the scaler.
// On fp32 storage unscaling is exact: the loss after the first (scaled) update is bitwise the
// unscaled run's. On fp16 storage the first two losses are those of the same run without injected
// overflows.
class LossScalingTest : public TrainStepTest, public ::testing::WithParamInterface<kernels::DType> {};

TEST_P(LossScalingTest, LossScalingSkipsOverflowStepsOnEveryRank) {
  const kernels::DType storage = GetParam();
  const std::set<int64_t> overflows = {1, 2, 4, 9};
  // initial 1024, growth_interval 3, backoff 0.5. Hysteresis 1: every overflow halves the scale.
  // Hysteresis 2: the first overflow after a growth (or the start) keeps it.
  const std::vector<std::pair<int, std::vector<double>>> want = {
      {1, {1024, 1024, 512, 256, 256, 128, 128, 128, 256, 256, 128, 128}},
      {2, {1024, 1024, 1024, 512, 512, 256, 256, 256, 512, 512, 512, 512}}};
  const int64_t steps = 12;
  recipe_.train.steps = steps;
  recipe_.parallel.dp = 2;
  std::vector<float> plain(2);
  auto plain_run = [&] {
    parallel::run_ranks_in_threads(2, [&](parallel::Comm& world) {
      Rank me(recipe_, prefix_, world.split(0, world.rank(), "world"), 2, 1, storage);
      for (int64_t s = 0; s < 2; ++s) {
        const StepOutcome o = me.step->run(s, s * recipe_.train.global_batch);
        if (world.rank() == 0) plain[size_t(s)] = o.loss;
      }
    });
  };
  if (storage == kernels::DType::fp32) plain_run();  // unscaled
  recipe_.train.precision = Precision::fp16;
  for (const auto& [hysteresis, scales] : want) {
    SCOPED_TRACE(::testing::Message() << "hysteresis " << hysteresis);
    recipe_.train.loss_scale = {.initial = 1024, .growth_interval = 3, .backoff = 0.5, .hysteresis = hysteresis};
    if (storage != kernels::DType::fp32) plain_run();  // scaled the same way, nothing injected
    parallel::run_ranks_in_threads(2, [&](parallel::Comm& world) {
      Rank me(recipe_, prefix_, world.split(0, world.rank(), "world"), 2, 1, storage);
      EXPECT_EQ(me.model.params().dtype, storage);
      const int rank = world.rank();
      me.step->set_overflow_injection([&](int64_t step) { return overflows.count(step) && step % 2 == rank; });
      for (int64_t s = 0; s < steps; ++s) {
        const StepOutcome o = me.step->run(s, s * recipe_.train.global_batch);
        const bool overflow = overflows.count(s) == 1;
        EXPECT_EQ(o.loss_scale, scales[size_t(s)]) << "step " << s << " rank " << rank;
        EXPECT_EQ(o.skipped, overflow) << "step " << s << " rank " << rank;
        EXPECT_EQ(o.overflow, overflow) << "step " << s << " rank " << rank;
        if (s < 2) {
          EXPECT_EQ(o.loss, plain[size_t(s)]) << "step " << s;
        }
      }
      EXPECT_EQ(me.step->optimizer().steps(), steps - int64_t(overflows.size()));
      const nlohmann::json state = me.step->state();
      EXPECT_EQ(state["skipped_total"], overflows.size());
      EXPECT_EQ(state["skipped_in_a_row"], 0) << "overflows do not count towards max_skipped_steps";
      // After step 11: the scale step 12 would use, two good steps since the last change.
      LossScaler next(recipe_.train.loss_scale);
      for (int64_t s = 0; s < steps; ++s) next.update(overflows.count(s) == 1);
      EXPECT_EQ(state["loss_scale"], next.state());
      EXPECT_EQ(state["loss_scale"]["good_steps"], 2);
      LossScaler restored(recipe_.train.loss_scale);
      restored.restore(state["loss_scale"]);
      EXPECT_EQ(restored.scale(), next.scale());
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Storage, LossScalingTest, ::testing::Values(kernels::DType::fp32, kernels::DType::fp16),
                         [](const auto& info) { return std::string(kernels::to_string(info.param)); });

// At the minimum scale an overflow is a non-finite step: train.on_nonfinite decides.
TEST_F(TrainStepTest, AnOverflowAtTheMinimumScaleIsNonFinite) {
  recipe_.train.precision = Precision::fp16;
  recipe_.train.loss_scale = {.initial = 2, .growth_interval = 100, .backoff = 0.5, .hysteresis = 1, .min = 1};
  Rank one(recipe_, prefix_, parallel::make_local_comm(), 1);
  one.step->set_overflow_injection([](int64_t) { return true; });
  const StepOutcome o = one.step->run(0, 0);
  EXPECT_TRUE(o.overflow);
  EXPECT_EQ(one.step->loss_scaler()->scale(), 1.0);
  EXPECT_THAT([&] { one.step->run(1, 8); },
              ::testing::ThrowsMessage<Error>(::testing::HasSubstr("non-finite gradient at step 2")));
}

// Issue 33: the loop state a manifest's `extra` holds was read with nlohmann's casts: a float where an
// integer belongs (1e300 skipped steps) was undefined behaviour, a string an escaping json exception.
TEST_F(TrainStepTest, HostileLoopStateFromAManifestIsAnError) {
  recipe_.train.precision = Precision::fp16;
  Rank one(recipe_, prefix_, parallel::make_local_comm(), 1);
  for (const char* bad : {R"({"skipped_total": 1e300})", R"({"skipped_total": "3"})", R"({"skipped_in_a_row": 11})",
                          R"({"loss_scale": {"scale": -1, "good_steps": 0, "hysteresis_left": 1}})",
                          R"({"loss_scale": {"scale": 1024, "good_steps": 1.5e30, "hysteresis_left": 1}})",
                          R"({"loss_scale": {"scale": 1024}})"})
    EXPECT_THROW(one.step->restore(nlohmann::json::parse(bad), 10), Error) << bad;
  EXPECT_NO_THROW(one.step->restore(one.step->state(), 10));
}

// The loss scale of a step is in metrics.jsonl and the console line; without scaling it is absent.
TEST_F(TrainStepTest, TheLossScaleIsInTheMetrics) {
  {
    MetricsLog log(dir_.string(), -1);
    StepMetrics scaled, plain;
    scaled.step = 1, scaled.loss_scale = 65536;
    plain.step = 2;
    log.write(scaled);
    log.write(plain);
    EXPECT_THAT(format_step_line(scaled), ::testing::HasSubstr("| loss scale 65536"));
    EXPECT_THAT(format_step_line(plain), ::testing::Not(::testing::HasSubstr("loss scale")));
  }
  std::ifstream in(dir_ / "metrics.jsonl");
  std::string first, second;
  ASSERT_TRUE(std::getline(in, first) && std::getline(in, second));
  EXPECT_EQ(nlohmann::json::parse(first).at("loss_scale"), 65536.0);
  EXPECT_FALSE(nlohmann::json::parse(second).contains("loss_scale"));
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
  EXPECT_EQ(one.step->state().at("skipped_total"), 1);
  EXPECT_EQ(one.step->state().at("skipped_in_a_row"), 1);
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
  for (auto ckpt : {ActivationCheckpointing::none, ActivationCheckpointing::selective, ActivationCheckpointing::full}) {
    recipe_.train.activation_checkpointing = ckpt;
    recipe_.parallel.dp = 1;
    const MemoryAccount plan = memory_plan(recipe_, test_layout(recipe_), {0, 0, 0});
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
  // ZeRO stage 1 at dp 2: each rank's moments cover its chunks (about half), plus the sync's
  // scratch; both ranks live in this process, so the allocator counts the sum of their plans.
  recipe_.train.activation_checkpointing = ActivationCheckpointing::none;
  recipe_.parallel.zero = 1;
  recipe_.parallel.dp = 2;
  MemoryAccount plan;
  for (int dp = 0; dp < 2; ++dp) {
    const MemoryAccount p = memory_plan(recipe_, test_layout(recipe_), {0, dp, 0});
    EXPECT_TRUE(p.notes.empty());
    EXPECT_LT(p.optimizer, p.parameters + 64);  // two moments over half of it, give or take padding
    plan.parameters += p.parameters, plan.gradients += p.gradients, plan.optimizer += p.optimizer;
    plan.activations += p.activations, plan.communication += p.communication;
  }
  MemoryAccount got;
  parallel::run_ranks_in_threads(2, [&](parallel::Comm& world) {
    Rank me(recipe_, prefix_, world.split(0, world.rank(), "world"), 2);
    me.step->run(0, 0);
    world.barrier();
    if (world.rank() == 0) got = memory_measured(kernels::Device::cpu, false);
    world.barrier();
  });
  EXPECT_EQ(got.parameters, plan.parameters);
  EXPECT_EQ(got.gradients, plan.gradients);
  EXPECT_EQ(got.optimizer, plan.optimizer);
  EXPECT_EQ(got.activations, plan.activations);
  EXPECT_EQ(got.communication, plan.communication);

  // ZeRO stage 2 at dp 2: no model gradient buffer; each rank's owned shard and pool (two shared
  // slots of the largest unit, and the tied embedding's unit's own slot: here the embedding is the
  // largest unit, so the pool is not smaller than the model).
  recipe_.parallel.zero = 2;
  recipe_.parallel.bucket_mb = 0.01;
  MemoryAccount plan2;
  for (int dp = 0; dp < 2; ++dp) {
    const MemoryAccount p = memory_plan(recipe_, test_layout(recipe_), {0, dp, 0});
    EXPECT_TRUE(p.notes.empty());
    plan2.parameters += p.parameters, plan2.gradients += p.gradients, plan2.optimizer += p.optimizer;
    plan2.activations += p.activations, plan2.communication += p.communication;
  }
  MemoryAccount got2;
  parallel::run_ranks_in_threads(2, [&](parallel::Comm& world) {
    Rank me(recipe_, prefix_, world.split(0, world.rank(), "world"), 2);
    me.step->run(0, 0);
    world.barrier();
    if (world.rank() == 0) got2 = memory_measured(kernels::Device::cpu, false);
    world.barrier();
  });
  EXPECT_EQ(got2.parameters, plan2.parameters);
  EXPECT_EQ(got2.gradients, plan2.gradients);
  EXPECT_EQ(got2.optimizer, plan2.optimizer);
  EXPECT_EQ(got2.activations, plan2.activations);
  EXPECT_EQ(got2.communication, plan2.communication);

  // ZeRO stage 3 at dp 2: no model parameter buffer either; each rank's owned values and the pool
  // units are gathered into, with the tied embedding's unit in a slot of its own or (untied) not.
  recipe_.parallel.zero = 3;
  for (const bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    recipe_.model.tie_embeddings = tied;
    MemoryAccount plan3;
    for (int dp = 0; dp < 2; ++dp) {
      const MemoryAccount p = memory_plan(recipe_, test_layout(recipe_), {0, dp, 0});
      EXPECT_TRUE(p.notes.empty());
      EXPECT_EQ(p.parameters, p.gradients);  // the same shard and the same pool shape
      plan3.parameters += p.parameters, plan3.gradients += p.gradients, plan3.optimizer += p.optimizer;
      plan3.activations += p.activations, plan3.communication += p.communication;
    }
    MemoryAccount got3;
    parallel::run_ranks_in_threads(2, [&](parallel::Comm& world) {
      Rank me(recipe_, prefix_, world.split(0, world.rank(), "world"), 2);
      me.step->run(0, 0);
      world.barrier();
      if (world.rank() == 0) got3 = memory_measured(kernels::Device::cpu, false);
      world.barrier();
    });
    EXPECT_EQ(got3.parameters, plan3.parameters);
    EXPECT_EQ(got3.gradients, plan3.gradients);
    EXPECT_EQ(got3.optimizer, plan3.optimizer);
    EXPECT_EQ(got3.activations, plan3.activations);
    EXPECT_EQ(got3.communication, plan3.communication);
  }
  recipe_.model.tie_embeddings = true;

  // 16-bit storage at ZeRO 0 (dp 1), 1 and 2 (dp 2): still what the ranks allocate; parameters in
  // half the bytes, and the optimizer's fp32 master beside the moments.
  for (const Precision precision : {Precision::bf16, Precision::fp16}) {
    SCOPED_TRACE(to_string(precision));
    for (const int zero : {0, 1, 2, 3}) {
      SCOPED_TRACE(::testing::Message() << "zero " << zero);
      Recipe r = recipe_;
      r.parallel.zero = zero, r.parallel.dp = zero == 0 ? 1 : 2;
      r.parallel.bucket_mb = 25;
      Recipe fp32 = r;
      fp32.train.precision = Precision::fp32;
      r.train.precision = precision;
      MemoryAccount plan16, plan32;
      for (int dp = 0; dp < r.parallel.dp; ++dp) {
        const MemoryAccount p = memory_plan(r, test_layout(r), {0, dp, 0}),
                            q = memory_plan(fp32, test_layout(fp32), {0, dp, 0});
        EXPECT_TRUE(p.notes.empty());
        plan16.parameters += p.parameters, plan16.gradients += p.gradients, plan16.optimizer += p.optimizer;
        plan16.activations += p.activations, plan16.communication += p.communication;
        plan32.parameters += q.parameters, plan32.optimizer += q.optimizer;
      }
      if (zero < 3) {
        EXPECT_EQ(2 * plan16.parameters, plan32.parameters);
        EXPECT_EQ(2 * plan16.optimizer, 3 * plan32.optimizer);  // master + two moments, all fp32
      } else {
        EXPECT_EQ(plan16.optimizer, plan32.optimizer);  // the owned fp32 values are the master
      }
      MemoryAccount got16;
      parallel::run_ranks_in_threads(r.parallel.dp, [&](parallel::Comm& world) {
        Rank me(r, prefix_, world.split(0, world.rank(), "world"), r.parallel.dp);
        me.step->run(0, 0);
        world.barrier();
        if (world.rank() == 0) got16 = memory_measured(kernels::Device::cpu, false);
        world.barrier();
      });
      EXPECT_EQ(got16.parameters, plan16.parameters);
      EXPECT_EQ(got16.gradients, plan16.gradients);
      EXPECT_EQ(got16.optimizer, plan16.optimizer);
      EXPECT_EQ(got16.activations, plan16.activations);
      EXPECT_EQ(got16.communication, plan16.communication);
    }
  }
}

TEST_F(TrainStepTest, GradientGroupsFollowBackward) {
  Rank one(recipe_, prefix_, parallel::make_local_comm(), 1);
  const auto groups = grad_ready_groups(one.model.options().stage, one.model.parameters());
  EXPECT_EQ(groups, one.placement.groups);
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
