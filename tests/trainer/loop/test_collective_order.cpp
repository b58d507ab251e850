// The property NCCL needs, for every layout: two training steps on in-process ranks (the real step:
// model, pipeline executor, gradient sync, ZeRO, context and expert parallelism), every operation on
// every tensor group logged and replayed under NCCL's rules (tests/parallel/comm/comm_order.h): each
// group's collectives in one order on every rank, its sends and receives matched by order without
// tags, and no rank waiting, across groups, for an operation its peer queues behind one of its own.
// The in-process communicator runs with MPI's rules, so a layout that trains here could still hang
// under NCCL; this is where that shows without a GPU.
#include <fmt/format.h>

#include "parallel/comm/comm_threads.h"
#include "tests/parallel/comm/comm_order.h"
#include "tests/trainer/loop/train_step_fixture.h"

namespace llmtrain::trainer {
namespace {

struct OrderLayout {
  std::string name;
  int tp = 1, pp = 1, dp = 1, cp = 1, ep = 1, zero = 0;
  bool sp = false;
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  int virtual_stages = 1;
  CpComm cp_comm = CpComm::ring;
  bool moe = false;
  bool muon = false;  // optimizer.name muon: under ZeRO its pieces' sends and receives, under tp its Gram sums
};

class CollectiveOrder : public TrainStepTest {
 protected:
  // The layout's two steps, logged; the replay's verdict ("" when NCCL would run them).
  std::string replay(const OrderLayout& l, size_t* operations) {
    Recipe r = recipe_;
    r.model.layers = 4;
    r.model.seq_len = 16, r.model.max_positions = 16;
    r.parallel.tp = l.tp, r.parallel.pp = l.pp, r.parallel.dp = l.dp, r.parallel.cp = l.cp, r.parallel.ep = l.ep;
    r.parallel.zero = l.zero, r.parallel.sequence_parallel = l.sp, r.parallel.pp_schedule = l.schedule;
    r.parallel.virtual_stages = l.virtual_stages, r.parallel.cp_comm = l.cp_comm;
    r.parallel.bucket_mb = 0.01;  // several buckets and ZeRO units
    if (l.muon) r.optimizer.name = OptimizerName::muon;
    if (l.moe)
      r.model.moe = {.experts = 4, .top_k = 2, .ffn_hidden = 32, .first_dense = 1, .aux_loss = 0.1, .z_loss = 0.01};
    const int world = l.tp * l.pp * l.dp * l.cp;
    parallel::OrderLog log(world);
    parallel::run_ranks_in_threads(world, [&](parallel::Comm& w) {
      Rank me(r, prefix_, log.wrap(w.split(0, w.rank(), "world")), l.dp, l.pp);
      for (int s = 0; s < 2; ++s) me.step->run(s, int64_t(s) * r.train.global_batch);
    });
    *operations = log.operations();
    return log.check_nccl_order();
  }
};

TEST_F(CollectiveOrder, EveryLayoutRunsUnderNcclsRules) {
  using PS = PipelineSchedule;
  const std::vector<OrderLayout> layouts = {
      {.name = "dp 2", .dp = 2},
      {.name = "dp 2 zero 1", .dp = 2, .zero = 1},
      {.name = "dp 2 zero 2", .dp = 2, .zero = 2},
      {.name = "dp 2 zero 3", .dp = 2, .zero = 3},
      {.name = "tp 2", .tp = 2},
      {.name = "tp 2 sp", .tp = 2, .sp = true},
      {.name = "pp 2 gpipe", .pp = 2, .schedule = PS::gpipe},
      {.name = "pp 2 1f1b", .pp = 2},
      {.name = "pp 2 interleaved", .pp = 2, .schedule = PS::interleaved, .virtual_stages = 2},
      {.name = "pp 2 zero_bubble", .pp = 2, .schedule = PS::zero_bubble},
      {.name = "tp 2 x pp 2", .tp = 2, .pp = 2},
      {.name = "pp 2 x dp 2 zero 1", .pp = 2, .dp = 2, .zero = 1},
      {.name = "cp 2 ring", .cp = 2},
      {.name = "cp 2 all_to_all", .cp = 2, .cp_comm = CpComm::all_to_all},
      {.name = "cp 2 x dp 2 zero 3", .dp = 2, .cp = 2, .zero = 3},
      {.name = "moe ep 2", .dp = 2, .ep = 2, .moe = true},
      {.name = "moe ep 2 zero 1", .dp = 2, .ep = 2, .zero = 1, .moe = true},
      {.name = "moe ep 2 x tp 2 sp", .tp = 2, .dp = 2, .ep = 2, .sp = true, .moe = true},
      {.name = "muon dp 2 zero 2", .dp = 2, .zero = 2, .muon = true},
      {.name = "muon tp 2 x dp 2 zero 1", .tp = 2, .dp = 2, .zero = 1, .muon = true},
      {.name = "muon moe dp 4 ep 2 zero 1", .dp = 4, .ep = 2, .zero = 1, .moe = true, .muon = true},
  };
  for (const OrderLayout& l : layouts) {
    size_t operations = 0;
    const std::string problem = replay(l, &operations);
    EXPECT_EQ(problem, "") << l.name;
    EXPECT_GT(operations, 0u) << l.name << ": nothing logged";
  }
}

}  // namespace
}  // namespace llmtrain::trainer
