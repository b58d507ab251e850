// The one-rank communicator: collectives are the identity or a copy (nothing, in place), async
// forms are done at once, split gives one-rank groups that keep the timeout.
#include <gtest/gtest.h>

#include "parallel/comm/comm.h"

namespace llmtrain::parallel {
namespace {

using kernels::host_tensor;

TEST(LocalComm, CollectivesOverOneRankAreCopies) {
  auto c = make_local_comm("tp");
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  std::vector<float> a{1, 2, 3}, b(3);
  c->all_reduce(host_tensor(a.data(), {3}), ReduceOp::avg);
  EXPECT_EQ(a, (std::vector<float>{1, 2, 3}));
  c->all_gather(host_tensor(a.data(), {3}), host_tensor(b.data(), {3}));
  EXPECT_EQ(b, a);
  std::fill(b.begin(), b.end(), 0.f);
  c->reduce_scatter(host_tensor(a.data(), {3}), host_tensor(b.data(), {3}), ReduceOp::sum);
  EXPECT_EQ(b, a);
  std::fill(b.begin(), b.end(), 0.f);
  c->all_to_all(host_tensor(a.data(), {3}), host_tensor(b.data(), {3}));
  EXPECT_EQ(b, a);
  auto w = c->all_reduce_async(host_tensor(a.data(), {3}), ReduceOp::sum);
  EXPECT_TRUE(w->done());
  w->wait();
  c->barrier();
  c->progress();
}

// The in-place forms of Comm's contract: over one rank, this rank's block is the whole buffer.
TEST(LocalComm, InPlaceGatherAndReduceScatterLeaveTheBlockAsItIs) {
  auto c = make_local_comm("dp");
  std::vector<float> a{1, 2, 3};
  const kernels::Tensor t = host_tensor(a.data(), {3});
  c->all_gather(t, t);  // `in` is rank 0's block of `out`
  EXPECT_EQ(a, (std::vector<float>{1, 2, 3}));
  c->reduce_scatter(t, t.flat(0, 3), ReduceOp::avg);  // `out` is rank 0's block of `in`
  EXPECT_EQ(a, (std::vector<float>{1, 2, 3}));
  c->all_gather_async(t.flat(0, 3), t)->wait();
  c->reduce_scatter_async(t, t, ReduceOp::sum)->wait();
  EXPECT_EQ(a, (std::vector<float>{1, 2, 3}));
}

TEST(LocalComm, SplitKeepsTheTimeout) {
  auto c = make_local_comm();
  c->set_timeout(4.0);
  auto s = c->split(0, 0, "dp");
  EXPECT_EQ(s->name(), "dp");
  EXPECT_DOUBLE_EQ(s->timeout(), 4.0);
}

TEST(LocalComm, ReduceOpsByDtype) {
  EXPECT_TRUE(reduce_supported(kernels::DType::bf16, ReduceOp::avg));
  EXPECT_TRUE(reduce_supported(kernels::DType::int64, ReduceOp::sum));
  EXPECT_FALSE(reduce_supported(kernels::DType::int32, ReduceOp::avg));
}

}  // namespace
}  // namespace llmtrain::parallel
