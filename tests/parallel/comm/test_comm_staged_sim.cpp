// The staged device communicator (parallel/comm/comm_staged.h) on the simulated device, ranks as threads
// over the in-process communicator: every operation on device tensors gives bitwise what the host
// communicator gives on the same values, a collective reduces what the kernels queued before it
// wrote (the simulator runs stream work that no event orders in the order that exposes a missing
// wait), and the compute stream's later work sees the result; a wait on one staged communicator
// starts the host operations of the thread's others.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/buffer.h"
#include "kernels/dtype_convert.h"
#include "kernels/ops.h"
#include "parallel/comm/comm_staged.h"
#include "parallel/comm/comm_threads.h"
#include "tests/parallel/comm/device_values.h"

namespace llmtrain::parallel {
namespace {

using kernels::Buffer;
using kernels::Device;
using kernels::DType;
using test::on_device;
using test::to_host;
using test::values;

// Each rank runs `fn` with its world wrapped in the staged communicator.
void run_staged(int n, const std::function<void(Comm& staged, Comm& host)>& fn) {
  run_ranks_in_threads(n, [&](Comm& world) {
    std::unique_ptr<Comm> staged = make_staged_comm(world.split(0, world.rank(), "staged"));
    fn(*staged, world);
  });
}

TEST(CommStagedSim, CollectivesOnDeviceTensorsMatchTheHostCommunicator) {
  constexpr int kRanks = 3;
  run_staged(kRanks, [](Comm& staged, Comm& host) { test::expect_collectives_match_host(staged, host); });
}

// Comm's in-place forms on device tensors, as ZeRO 3 runs them in a pool slot: an all-gather whose
// input is this rank's block of the output, and a reduce-scatter onto this rank's block of its
// input, each equal to the host communicator's separate form.
TEST(CommStagedSim, InPlaceGatherAndReduceScatterMatchTheSeparateForms) {
  constexpr int kRanks = 3, kN = 5;
  run_staged(kRanks, [](Comm& staged, Comm& host) {
    const int r = staged.rank();
    std::vector<float> slot(size_t(kN * kRanks), -1.0f), mine = values(r, kN, 3.0f), all(size_t(kN * kRanks));
    std::copy(mine.begin(), mine.end(), slot.begin() + r * kN);
    Buffer dslot = on_device(slot);
    staged.all_gather_async(dslot.tensor().flat(r * kN, kN), dslot.tensor())->wait();
    host.all_gather(kernels::host_tensor(mine.data(), {kN}), kernels::host_tensor(all.data(), {kN * kRanks}));
    EXPECT_EQ(to_host(dslot), all) << "all_gather in place";
    std::vector<float> in = values(r, kN * kRanks, 2.0f), out(kN);
    Buffer din = on_device(in);
    staged.reduce_scatter_async(din.tensor(), din.tensor().flat(r * kN, kN), ReduceOp::avg)->wait();
    host.reduce_scatter(kernels::host_tensor(in.data(), {kN * kRanks}), kernels::host_tensor(out.data(), {kN}),
                        ReduceOp::avg);
    const std::vector<float> got = to_host(din);  // the rest of the input is unspecified
    EXPECT_EQ(std::vector<float>(got.begin() + r * kN, got.begin() + (r + 1) * kN), out) << "reduce_scatter in place";
  });
}

// Sends and receives around a ring, both directions at once, with host operations between them:
// every transfer arrives, and host and device operations keep the order they were called in.
TEST(CommStagedSim, PointToPointBothWaysAndMixedWithHostOperations) {
  constexpr int kRanks = 3, kN = 8;
  run_staged(kRanks, [](Comm& staged, Comm&) {
    const int r = staged.rank(), next = (r + 1) % kRanks, prev = (r + kRanks - 1) % kRanks;
    Buffer to_next = on_device(values(r, kN, 6.0f)), to_prev = on_device(values(r, kN, 7.0f));
    Buffer from_prev(DType::fp32, {kN}, Device::cuda), from_next(DType::fp32, {kN}, Device::cuda);
    std::vector<WorkHandle> works;
    works.push_back(staged.recv_async(from_prev.tensor(), prev, 1));
    works.push_back(staged.send_async(to_next.tensor(), next, 1));
    float host_value = float(r);
    works.push_back(staged.all_reduce_async(kernels::host_tensor(&host_value, {1}), ReduceOp::sum));
    works.push_back(staged.send_async(to_prev.tensor(), prev, 2));
    works.push_back(staged.recv_async(from_next.tensor(), next, 2));
    wait_all(works);
    EXPECT_EQ(to_host(from_prev), values(prev, kN, 6.0f));
    EXPECT_EQ(to_host(from_next), values(next, kN, 7.0f));
    EXPECT_EQ(host_value, 0.0f + 1.0f + 2.0f);
  });
}

// All-to-all with per-rank counts: rank r sends r + q + 1 elements to rank q (its own part copied),
// each element naming its sender, receiver and index; every rank receives what each sender meant
// for it, in rank order.
TEST(CommStagedSim, AllToAllWithPerRankCounts) {
  constexpr int kRanks = 3;
  run_staged(kRanks, [](Comm& staged, Comm&) {
    const int r = staged.rank();
    std::vector<int64_t> send_counts, recv_counts;
    std::vector<float> in, expected;
    for (int q = 0; q < kRanks; ++q) {
      send_counts.push_back(r + q + 1);
      recv_counts.push_back(q + r + 1);
      for (int i = 0; i < r + q + 1; ++i) in.push_back(float(100 * r + 10 * q + i));
      for (int i = 0; i < q + r + 1; ++i) expected.push_back(float(100 * q + 10 * r + i));
    }
    Buffer din = on_device(in), dout(DType::fp32, {int64_t(expected.size())}, Device::cuda);
    staged.all_to_all_v_async(din.tensor(), send_counts, dout.tensor(), recv_counts)->wait();
    EXPECT_EQ(to_host(dout), expected);
  });
}

// The input of a collective is what the kernels queued before the call wrote, and the kernels
// queued after its wait() read its result: the communication stream waits for an event recorded
// on the compute stream, and the compute stream for one recorded behind the copy back. Without
// either wait the simulator runs the copies out of order and this fails.
TEST(CommStagedSim, ACollectiveSeesTheKernelsBeforeItAndTheKernelsAfterSeeItsResult) {
  constexpr int kRanks = 2, kN = 64;
  run_staged(kRanks, [](Comm& staged, Comm&) {
    const int r = staged.rank();
    std::vector<float> h(kN, float(r + 1));
    Buffer d = on_device(h);
    kernels::scale(d.tensor(), 2.0f);  // queued on the compute stream, not yet run
    WorkHandle w = staged.all_reduce_async(d.tensor(), ReduceOp::sum);
    w->wait();
    kernels::scale(d.tensor(), 0.5f);  // must read the reduced values
    EXPECT_EQ(to_host(d), std::vector<float>(kN, (2.0f * 1 + 2.0f * 2) * 0.5f));
  });
}

// Two one-way links between the same two ranks, as two pipeline stages hold them: rank 0 sends on
// link a, then waits for a receive on link b; rank 1 sends on b only once a's message arrived. Rank
// 0's send starts on the host only inside a call on a staged communicator, and the one it makes is
// a wait on b: unless that wait advances a too, both ranks wait until the timeout.
TEST(CommStagedSim, AWaitOnOneCommunicatorStartsTheOthers) {
  run_ranks_in_threads(
      2,
      [](Comm& world) {
        const int r = world.rank();
        std::unique_ptr<Comm> a = make_staged_comm(world.split(0, r, "a"));
        std::unique_ptr<Comm> b = make_staged_comm(world.split(0, r, "b"));
        Buffer sent = on_device(values(r, 8, 1.0f)), got(DType::fp32, {8}, Device::cuda);
        if (r == 0) {
          WorkHandle send = a->send_async(sent.tensor(), 1);
          b->recv_async(got.tensor(), 1)->wait();
          send->wait();
          EXPECT_EQ(to_host(got), values(1, 8, 1.0f));
        } else {
          a->recv_async(got.tensor(), 0)->wait();
          EXPECT_EQ(to_host(got), values(0, 8, 1.0f));
          b->send_async(sent.tensor(), 0)->wait();
        }
      },
      20.0);
}

}  // namespace
}  // namespace llmtrain::parallel
