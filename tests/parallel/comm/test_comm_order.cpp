// The NCCL-order replay (tests/parallel/comm/comm_order.h) on patterns it must accept and patterns that
// complete under MPI's rules but hang under NCCL's.
#include <gtest/gtest.h>

#include "parallel/comm/comm_threads.h"
#include "tests/parallel/comm/comm_order.h"

namespace llmtrain::parallel {
namespace {

using kernels::DType;

LoggedOp collective(const std::string& group, int rank, const std::string& what) {
  return {.group = group,
          .group_size = 2,
          .rank = rank,
          .collective = what,
          .transfers = {},
          .what = what,
          .observed_before = 0};
}

LoggedOp transfer(const std::string& group, int rank, bool send, int64_t count) {
  return {.group = group,
          .group_size = 2,
          .rank = rank,
          .collective = {},
          .transfers = {{send, 1 - rank, count, DType::fp32}},
          .what = send ? "send" : "recv",
          .observed_before = 0};
}

TEST(NcclOrder, AcceptsCollectivesAndTransfersInOneOrder) {
  OrderLog log(2);
  for (int r = 0; r < 2; ++r) {
    log.add(r, collective("g", r, "all_reduce of 4 fp32"));
    log.add(r, transfer("g", r, r == 0, 8));
    log.add(r, transfer("g", r, r == 1, 8));
  }
  EXPECT_EQ(log.check_nccl_order(), "");
}

// Rank 0 sends then reduces, rank 1 reduces then receives: MPI completes it (the send waits in a
// queue), NCCL's one stream per communicator does not.
TEST(NcclOrder, FindsASendQueuedBeforeACollectiveThePeerStartsFirst) {
  OrderLog log(2);
  log.add(0, transfer("g", 0, true, 8));
  log.add(0, collective("g", 0, "all_reduce of 4 fp32"));
  log.add(1, collective("g", 1, "all_reduce of 4 fp32"));
  log.add(1, transfer("g", 1, false, 8));
  const std::string problem = log.check_nccl_order();
  EXPECT_NE(problem.find("never complete"), std::string::npos) << problem;
  EXPECT_NE(problem.find("rank 0 waits in: send on g"), std::string::npos) << problem;
}

// Two groups, each rank waiting for one before starting the other, in opposite orders.
TEST(NcclOrder, FindsWaitsThatCrossBetweenGroups) {
  OrderLog log(2);
  log.add(0, collective("a", 0, "all_reduce of 4 fp32"));
  log.observe(0, 0);
  log.add(0, collective("b", 0, "all_reduce of 4 fp32"));
  log.add(1, collective("b", 1, "all_reduce of 4 fp32"));
  log.observe(1, 0);
  log.add(1, collective("a", 1, "all_reduce of 4 fp32"));
  EXPECT_NE(log.check_nccl_order().find("never complete"), std::string::npos);
  // Without the waits both groups run side by side.
  OrderLog free(2);
  free.add(0, collective("a", 0, "all_reduce of 4 fp32"));
  free.add(0, collective("b", 0, "all_reduce of 4 fp32"));
  free.add(1, collective("b", 1, "all_reduce of 4 fp32"));
  free.add(1, collective("a", 1, "all_reduce of 4 fp32"));
  EXPECT_EQ(free.check_nccl_order(), "");
}

// The end of a communicator is a collective the rank waits in (NCCL's finalize): two ranks that
// tear down two groups in opposite orders wait for each other.
TEST(NcclOrder, FindsTeardownsInDifferentOrders) {
  for (const bool same_order : {true, false}) {
    OrderLog log(2);
    for (int r = 0; r < 2; ++r) {
      const bool a_first = same_order || r == 0;
      log.add(r, collective(a_first ? "a" : "b", r, "finalize"));
      log.observe(r, 0);
      log.add(r, collective(a_first ? "b" : "a", r, "finalize"));
      log.observe(r, 1);
    }
    EXPECT_EQ(log.check_nccl_order().find("never complete") != std::string::npos, !same_order)
        << log.check_nccl_order();
  }
}

TEST(NcclOrder, FindsCollectivesThatDiffer) {
  OrderLog log(2);
  log.add(0, collective("g", 0, "all_reduce of 4 fp32"));
  log.add(1, collective("g", 1, "all_reduce of 8 fp32"));
  EXPECT_NE(log.check_nccl_order().find("collective 0 is all_reduce of 4 fp32 on rank 0"), std::string::npos);
}

// Without tags the k-th send meets the k-th receive: sizes that only tags would pair are wrong.
TEST(NcclOrder, FindsMessagesThatOnlyTagsWouldMatch) {
  OrderLog log(2);
  log.add(0, transfer("g", 0, true, 8));
  log.add(0, transfer("g", 0, true, 16));
  log.add(1, transfer("g", 1, false, 16));
  log.add(1, transfer("g", 1, false, 8));
  EXPECT_NE(log.check_nccl_order().find("without tags"), std::string::npos);
}

// Through the wrapper, on the in-process communicator: the same pattern as above runs there (MPI's
// rules) and the log shows it would hang under NCCL; control groups are not logged.
TEST(NcclOrder, LogsWhatRanksStartOnTheirGroups) {
  for (const bool nccl_safe : {true, false}) {
    OrderLog log(2);
    run_ranks_in_threads(2, [&](Comm& world) {
      std::unique_ptr<Comm> wrapped = log.wrap(world.split(0, world.rank(), "world"));
      std::unique_ptr<Comm> g = wrapped->split(0, world.rank(), "tp");
      std::unique_ptr<Comm> control = wrapped->split(0, world.rank(), "tp control");
      float x[4] = {1, 2, 3, 4}, y[8] = {};
      const Tensor a(x, DType::fp32, {4}), b(y, DType::fp32, {8});
      control->all_reduce(a, ReduceOp::sum);
      if (world.rank() == 0) {
        WorkHandle send = g->send_async(b, 1);
        if (nccl_safe) send->wait();
        g->all_reduce(a, ReduceOp::sum);
        send->wait();
      } else {
        if (nccl_safe) g->recv(b, 0);
        g->all_reduce(a, ReduceOp::sum);
        if (!nccl_safe) g->recv(b, 0);
      }
    });
    EXPECT_EQ(log.operations(), 6u);  // 2 ranks × (send/recv, all-reduce, the group's finalize)
    EXPECT_EQ(log.check_nccl_order().empty(), nccl_safe) << log.check_nccl_order();
  }
}

}  // namespace
}  // namespace llmtrain::parallel
