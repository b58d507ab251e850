// CountingComm (tests/parallel/comm/comm_counting.h): forwards every call unchanged and counts the ring volume
// each rank sends, per kind of call, on the in-process communicator.
#include <gtest/gtest.h>

#include <vector>

#include "parallel/comm/comm_threads.h"
#include "tests/parallel/comm/comm_counting.h"

namespace llmtrain::parallel {
namespace {

using kernels::host_tensor;

TEST(CountingComm, CountsTheRingVolumeEachRankSends) {
  run_ranks_in_threads(4, [](Comm& world) {
    CountingComm c(world.split(0, world.rank(), "tp"));
    std::vector<float> buf(8, 1.0f), in(8, 1.0f), out(2), gathered(32);
    c.all_reduce(host_tensor(buf.data(), {8}), ReduceOp::sum);
    EXPECT_EQ(buf, std::vector<float>(8, 4.0f)) << "forwarded";
    EXPECT_EQ(c.bytes_sent(CountingComm::all_reduce_op), 2 * 3 * 32 / 4);  // 2(n-1)/n of 32 bytes
    c.reduce_scatter(host_tensor(in.data(), {8}), host_tensor(out.data(), {2}), ReduceOp::sum);
    EXPECT_EQ(c.bytes_sent(CountingComm::reduce_scatter_op), 3 * 32 / 4);  // (n-1)/n of the input
    c.all_gather(host_tensor(out.data(), {2}), host_tensor(gathered.data(), {8}));
    EXPECT_EQ(c.bytes_sent(CountingComm::all_gather_op), 3 * 32 / 4);  // (n-1)/n of the output
    c.all_reduce_async(host_tensor(buf.data(), {8}), ReduceOp::sum)->wait();
    EXPECT_EQ(c.calls(CountingComm::all_reduce_op), 2);
    EXPECT_EQ(c.bytes_sent(), 2 * 48 + 24 + 24);
    c.barrier();
    c.reset();
    EXPECT_EQ(c.bytes_sent(), 0);
    EXPECT_EQ(c.calls(CountingComm::all_reduce_op), 0);
  });
  // 16-bit buffers: gathers move their 2-byte words; a reduction widened to fp32 moves 4 bytes per
  // element, one summed in 16 bits (Accumulate::in_dtype) 2.
  run_ranks_in_threads(4, [](Comm& world) {
    CountingComm c(world.split(0, world.rank(), "tp"));
    std::vector<uint16_t> part(2, 0x3f80), all(8), sum(8, 0x3f80);
    c.all_gather(Tensor(part.data(), kernels::DType::bf16, {2}), Tensor(all.data(), kernels::DType::bf16, {8}));
    EXPECT_EQ(c.bytes_sent(CountingComm::all_gather_op), 3 * 16 / 4);
    c.all_reduce(Tensor(sum.data(), kernels::DType::bf16, {8}), ReduceOp::sum);
    EXPECT_EQ(c.bytes_sent(CountingComm::all_reduce_op), 2 * 3 * 32 / 4);
    c.reset();
    c.all_reduce(Tensor(sum.data(), kernels::DType::bf16, {8}), Reduction(ReduceOp::sum, Accumulate::in_dtype));
    EXPECT_EQ(c.bytes_sent(CountingComm::all_reduce_op), 2 * 3 * 16 / 4);
  });
  CountingComm one(make_local_comm("tp"));
  std::vector<float> x(4);
  one.all_reduce(host_tensor(x.data(), {4}), ReduceOp::sum);
  EXPECT_EQ(one.bytes_sent(), 0) << "one rank sends nothing";
  EXPECT_EQ(one.calls(CountingComm::all_reduce_op), 1);
}

}  // namespace
}  // namespace llmtrain::parallel
