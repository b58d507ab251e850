// The planner's memory per rank against what ranks allocate: for layouts of dp, tp, pp and ZeRO that
// train on this CPU (ranks as threads of this process, one optimizer step each), the predicted
// peak (trainer/plan/layout_search.h: the one memory account's total, plus the device's reserved
// bytes, none on a CPU) summed over the ranks lies within 10% of the allocator's peak of all
// Buffers at once (kernels::memory_use: every kind, `other` included), which this process's
// ranks together reached. docs/plan.md §3 says what is and is not counted.
#include "common/recipe/recipe_check.h"
#include "parallel/mesh.h"
#include "tests/trainer/train_step_fixture.h"
#include "trainer/plan/layout_search.h"

namespace llmtrain::trainer {
namespace {

class PlanMemory : public TrainStepTest {
 protected:
  struct MeshRank {
    MeshRank(const Recipe& r, const std::string& prefix, std::unique_ptr<parallel::Comm> world)
        : mesh({r.parallel.tp, r.parallel.pp, r.parallel.dp}, world->rank()),
          comms(parallel::make_mesh_comms(mesh, std::move(world))),
          data({{prefix, 1.0}}, r.model.seq_len, 7, r.model.vocab),
          sampler(r.train.global_batch, r.train.micro_batch, comms.dp->rank(), r.parallel.dp),
          batches(data, sampler, r.model.seq_len),
          schedule(step_schedule(r, mesh.coord().pp, sampler.micro_batches_per_step())),
          model(r.model, step_model_options(r, mesh.coord().pp, schedule), *comms.tp) {
      step.emplace(r, model, comms, batches, schedule);
      model.init_parameters(11);
      step->master_from_params();
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

  struct Case {
    int tp, pp, dp, zero;
    Precision precision = Precision::fp32;
    ActivationCheckpointing recompute = ActivationCheckpointing::none;
  };
};

TEST_F(PlanMemory, PredictedPeakPerRankIsWithinTenPercentOfTheMeasured) {
  recipe_.model.layers = 4;
  const plan::DeviceSpec cpu = plan::device_memory("cpu");
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
    r.parallel.bucket_mb = 0.01;
    r.train.precision = c.precision;
    r.train.activation_checkpointing = c.recompute;
    const int world = c.tp * c.pp * c.dp;
    ASSERT_TRUE(recipe_check(r, {world, "test", false}).empty());
    int64_t predicted = 0;
    for (int rank = 0; rank < world; ++rank)
      predicted += plan::predict_rank_memory(r, parallel::Mesh({c.tp, c.pp, c.dp}, rank).coord(), cpu);
    kernels::memory_reset_peaks();
    int64_t measured = 0;
    parallel::run_ranks_in_threads(world, [&](parallel::Comm& comm) {
      {
        MeshRank me(r, prefix_, comm.split(0, comm.rank(), "world"));
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

}  // namespace
}  // namespace llmtrain::trainer
