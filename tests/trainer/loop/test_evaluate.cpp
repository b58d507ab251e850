// Evaluation through the pipeline executor (trainer/loop/evaluate.h), thread ranks on the in-process
// communicator: an 8-layer Llama with a tied embedding, evaluated before any step, gives the one-rank
// validation loss at pp 2 and pp 4 with every schedule (GPipe, 1F1B, interleaved over two virtual
// chunks, zero-bubble), and at pp 2 × tp 2 with sequence parallelism. The forwards cross stages in
// fp32 as one rank keeps them, so pipelines alone give bitwise one rank's loss; tensor parallelism
// sums the row-parallel products in another order (rounding, ~1e-7 relative; bound 1e-5).
#include <mutex>

#include "tests/trainer/loop/train_step_fixture.h"
#include "trainer/loop/evaluate.h"

namespace llmtrain::trainer {
namespace {

TEST_F(TrainStepTest, PipelinedEvaluationGivesTheOneRankLoss) {
  recipe_.model.layers = 8;
  constexpr int kBatches = 2;
  auto evaluate = [&](const Recipe& r, Rank& me) {
    return Evaluator(me.model, me.batches, kBatches, me.sampler.micro_batches_per_step(), r.train.global_batch,
                     me.step->schedule(), me.comms)
        .run();
  };
  Rank one(recipe_, prefix_, parallel::make_local_comm(), 1);
  const float want = evaluate(recipe_, one);
  EXPECT_GT(want, 0.0f);

  struct Layout {
    int pp;
    PipelineSchedule schedule;
    int tp = 1;
  };
  std::vector<Layout> layouts;
  for (const PipelineSchedule s : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b,
                                   PipelineSchedule::interleaved, PipelineSchedule::zero_bubble})
    for (const int pp : {2, 4}) layouts.push_back({pp, s});
  for (const PipelineSchedule s : {PipelineSchedule::gpipe, PipelineSchedule::one_f_one_b,
                                   PipelineSchedule::interleaved, PipelineSchedule::zero_bubble})
    layouts.push_back({2, s, 2});
  for (const Layout& l : layouts) {
    SCOPED_TRACE(fmt::format("pp {} {} tp {}", l.pp, to_string(l.schedule), l.tp));
    Recipe r = recipe_;
    r.parallel.pp = l.pp, r.parallel.tp = l.tp, r.parallel.pp_schedule = l.schedule;
    r.parallel.sequence_parallel = l.tp > 1;
    r.parallel.virtual_stages = l.schedule == PipelineSchedule::interleaved ? 2 : 1;
    std::vector<float> got(size_t(l.pp * l.tp));
    parallel::run_ranks_in_threads(l.pp * l.tp, [&](parallel::Comm& world) {
      const int rank = world.rank();
      Rank me(r, prefix_, world.split(0, rank, "world"), 1, l.pp);
      got[size_t(rank)] = evaluate(r, me);
    });
    for (size_t rank = 0; rank < got.size(); ++rank) {
      if (l.tp == 1)
        EXPECT_EQ(got[rank], want) << "rank " << rank;
      else
        EXPECT_NEAR(got[rank], want, 1e-5 * want) << "rank " << rank;
    }
  }
}

}  // namespace
}  // namespace llmtrain::trainer
