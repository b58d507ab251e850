// The NCCL device communicator (parallel/comm/comm_nccl.cpp) on the simulator's NCCL
// (kernels/cuda/sim/sim_nccl.cpp): ranks as threads of this process, each on a simulated device
// and a compute stream of its own. Every operation gives what the host communicator gives; the
// lifetime rules hold — a communicator torn down with work in flight finishes it (the planted
// abort at teardown leaves the peer hanging until its watchdog ends the process), a handle outlives
// its communicator, a dropped handle still rounds back (and is fatal when asked), an operation queued
// behind long compute does not time out, one that started and never completes does, naming which
// bound ran out, and ranks that call different collectives are reported; events are reused.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "kernels/buffer.h"
#include "kernels/cuda/sim/sim_counters.h"
#include "kernels/device_select.h"
#include "kernels/device_stream.h"
#include "kernels/dtype_convert.h"
#include "kernels/ops.h"
#include "parallel/comm/comm_nccl.h"
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

// A death test's statement whose job the watchdog is to end (abort_job: the message, then _Exit):
// `body`, then up to 30 s for that exit. The rank whose operation times out also ends its own wait
// at that moment with an exception, which would otherwise end the statement, racing the watchdog's
// _Exit (gtest then reports "failed to die" with the watchdog's message already written).
void until_the_watchdog_ends_it(const std::function<void()>& body) {
  try {
    body();
  } catch (...) {  // the rank's own timeout: the watchdog's exit is what the test waits for
  }
  std::this_thread::sleep_for(std::chrono::seconds(30));
}

// Each rank (a thread) on simulated device `rank`, with a compute stream of its own and an NCCL
// communicator over a split of the world (`timeout_s`).
void run_nccl(int n, const std::function<void(Comm& nccl, Comm& host)>& fn, double timeout_s = 20) {
  setenv("LLMTRAIN_SIM_DEVICES", "8", 1);
  run_ranks_in_threads(
      n,
      [&](Comm& world) {
        kernels::device_make_current(world.rank());
        kernels::ThreadComputeStream own(Device::cuda);
        std::unique_ptr<Comm> host = world.split(0, world.rank(), "nccl");
        host->set_timeout(timeout_s);
        std::unique_ptr<Comm> nccl = make_nccl_comm(std::move(host));
        fn(*nccl, world);
      },
      120.0);
}

TEST(CommNcclSim, OperationsMatchTheHostCommunicator) {
  constexpr int kRanks = 3, kN = 12;
  run_nccl(kRanks, [](Comm& nccl, Comm& host) {
    test::expect_collectives_match_host(nccl, host);
    const int r = nccl.rank();
    // Point to point around the ring both ways in one exchange.
    const int next = (r + 1) % kRanks, prev = (r + kRanks - 1) % kRanks;
    Buffer to_next = on_device(values(r, kN, 6.0f)), from_prev(DType::fp32, {kN}, Device::cuda);
    nccl.exchange_async(
            {{Transfer::Kind::recv, from_prev.tensor(), prev, 0}, {Transfer::Kind::send, to_next.tensor(), next, 0}})
        ->wait();
    EXPECT_EQ(to_host(from_prev), values(prev, kN, 6.0f)) << "exchange";
    // 16-bit sums: accumulated in fp32 (widened) or in bf16 (every partial rounded), as the host does.
    for (Accumulate acc : {Accumulate::fp32, Accumulate::in_dtype}) {
      std::vector<float> hv = values(r, kN, 7.3f);
      Buffer dv = on_device(hv, DType::bf16), hb(DType::bf16, {kN});
      kernels::copy(hb.tensor(), on_device(hv, DType::bf16).tensor());
      nccl.all_reduce_async(dv.tensor(), Reduction(ReduceOp::sum, acc))->wait();
      host.all_reduce(hb.tensor(), Reduction(ReduceOp::sum, acc));
      Buffer hw(DType::fp32, {kN});
      kernels::convert(hw.tensor(), hb.tensor());
      const float* want = hw.tensor().ptr<float>();
      EXPECT_EQ(to_host(dv), std::vector<float>(want, want + kN)) << "bf16 sum, " << to_string(acc);
    }
  });
}

// The compute stream's work before an operation is its input, the work after reads its result.
TEST(CommNcclSim, AnOperationSeesTheKernelsBeforeItAndTheKernelsAfterSeeItsResult) {
  run_nccl(2, [](Comm& nccl, Comm&) {
    const int r = nccl.rank();
    Buffer d = on_device(std::vector<float>(64, float(r + 1)));
    kernels::scale(d.tensor(), 2.0f);
    nccl.all_reduce_async(d.tensor(), ReduceOp::sum)->wait();
    kernels::scale(d.tensor(), 0.5f);
    EXPECT_EQ(to_host(d), std::vector<float>(64, 3.0f));
  });
}

// Rank 0 tears its communicator down with its all-reduce still queued (the simulator has not run
// it), then waits on the handle: the teardown lets the operation finish on the device and
// finalizes, so rank 1, which needs rank 0's part, completes; the handle works after the teardown.
TEST(CommNcclSim, TeardownFinishesTheOperationsInFlightAndHandlesOutliveTheCommunicator) {
  setenv("LLMTRAIN_SIM_DEVICES", "8", 1);
  run_ranks_in_threads(2, [](Comm& world) {
    const int r = world.rank();
    kernels::device_make_current(r);
    kernels::ThreadComputeStream own(Device::cuda);
    std::unique_ptr<Comm> host = world.split(0, r, "nccl");
    host->set_timeout(5);
    std::unique_ptr<Comm> nccl = make_nccl_comm(std::move(host));
    // bf16 accumulated in fp32: the handle's wait rounds the fp32 sum back into `d`.
    Buffer d = on_device(std::vector<float>(16, float(r + 1)), DType::bf16);
    WorkHandle w = nccl->all_reduce_async(d.tensor(), ReduceOp::sum);
    if (r == 0) nccl.reset();  // torn down with the operation queued
    w->wait();
    EXPECT_EQ(to_host(d), std::vector<float>(16, 3.0f)) << "rank " << r;
  });
}

// The planted bug: a teardown that aborts its communicator with work in flight. Rank 0 tears its
// communicator down with its all-reduce queued, and only then (a barrier on the host) does rank 1
// queue its own, so the all-reduce cannot have run before the teardown. The abort released rank 0's
// part undone: rank 1's all-reduce started on the device then never completes, and its watchdog
// ends the process when its parallel.timeout (0.5 s) runs out, naming the operation. Without the
// plant, rank 0's teardown would wait for the all-reduce to finish (its own bound is 60 s) and rank
// 1's barrier would time out first (30 s), failing the test with that message instead.
TEST(CommNcclSimDeathTest, PlantedAbortAtTeardownLeavesThePeerHanging) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      until_the_watchdog_ends_it([] {
        plant_nccl_abort_on_teardown(true);
        setenv("LLMTRAIN_SIM_DEVICES", "8", 1);
        run_ranks_in_threads(
            2,
            [](Comm& world) {
              const int r = world.rank();
              kernels::device_make_current(r);
              kernels::ThreadComputeStream own(Device::cuda);
              std::unique_ptr<Comm> host = world.split(0, r, "nccl");
              host->set_timeout(r == 0 ? 60 : 0.5);
              std::unique_ptr<Comm> nccl = make_nccl_comm(std::move(host));
              Buffer d = on_device(std::vector<float>(16, 1.0f));
              if (r == 0) {
                WorkHandle w = nccl->all_reduce_async(d.tensor(), ReduceOp::sum);
                nccl.reset();     // torn down with its part queued
                world.barrier();  // rank 1 may queue its part
                world.barrier();  // reached only if rank 1's all-reduce completed
                return;
              }
              world.barrier();
              WorkHandle w = nccl->all_reduce_async(d.tensor(), ReduceOp::sum);
              w->wait();
              to_host(d);
              world.barrier();
            },
            30.0);
      }),
      ::testing::ExitedWithCode(1),
      "timed out after 0.5s waiting for all_reduce of 16 fp32 on group 'nccl' \\(2 ranks; this is its rank 1\\): "
      "it started on the device");
}

// An operation queued behind compute that takes longer than parallel.timeout (rank 0's compute
// stream waits for a broadcast on another communicator that rank 1 joins only after three times
// the timeout) does not time out: it has not started on the device.
TEST(CommNcclSim, AnOperationQueuedBehindLongComputeDoesNotTimeOut) {
  setenv("LLMTRAIN_SIM_DEVICES", "8", 1);
  run_ranks_in_threads(2, [](Comm& world) {
    const int r = world.rank();
    kernels::device_make_current(r);
    kernels::ThreadComputeStream own(Device::cuda);
    std::unique_ptr<Comm> slow_host = world.split(0, r, "slow"), fast_host = world.split(0, r, "fast");
    slow_host->set_timeout(30);
    fast_host->set_timeout(0.5);
    std::unique_ptr<Comm> slow = make_nccl_comm(std::move(slow_host));
    std::unique_ptr<Comm> fast = make_nccl_comm(std::move(fast_host));
    Buffer gate = on_device({float(r)}), d = on_device(std::vector<float>(8, float(r + 1)));
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    slow->broadcast_async(gate.tensor(), 1)->wait();  // the compute stream now waits for it
    kernels::scale(d.tensor(), 1.0f);                 // compute behind it
    fast->all_reduce_async(d.tensor(), ReduceOp::sum)->wait();
    EXPECT_EQ(to_host(d), std::vector<float>(8, 3.0f));
    EXPECT_EQ(to_host(gate), std::vector<float>{1.0f});
  });
}

// One rank never starts the all-reduce: the other's, started on the device, times out and ends the
// process with the operation, the group and the bound that ran out.
TEST(CommNcclSimDeathTest, AStartedOperationThatNeverCompletesTimesOut) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(until_the_watchdog_ends_it([] {
                run_nccl(
                    2,
                    [](Comm& nccl, Comm& host) {
                      Buffer d = on_device(std::vector<float>(8, 1.0f));
                      if (nccl.rank() == 0) {
                        nccl.all_reduce_async(d.tensor(), ReduceOp::sum)->wait();
                        to_host(d);
                      }
                      host.barrier();
                    },
                    0.5);
              }),
              ::testing::ExitedWithCode(1),
              "timed out after 0.5s waiting for all_reduce of 8 fp32 on group 'nccl' \\(2 ranks; this is its rank "
              "0\\): it started on the device .* ago and has not completed");
}

// Ranks that start different collectives as the same one: NCCL's asynchronous error, reported by
// the watchdog with what each rank started.
TEST(CommNcclSimDeathTest, RanksThatCallDifferentCollectivesAreReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(until_the_watchdog_ends_it([] {
                run_nccl(
                    2,
                    [](Comm& nccl, Comm&) {
                      Buffer d = on_device(std::vector<float>(8, 1.0f)), all(DType::fp32, {16}, Device::cuda);
                      if (nccl.rank() == 0)
                        nccl.all_reduce_async(d.tensor(), ReduceOp::sum)->wait();
                      else
                        nccl.all_gather_async(d.tensor(), all.tensor())->wait();
                      to_host(d);
                      std::this_thread::sleep_for(std::chrono::seconds(30));
                    },
                    20);
              }),
              ::testing::ExitedWithCode(1),
              "NCCL reported an error on group 'nccl' \\(2 ranks; this is its rank [01]\\): invalid usage .*rank 0 "
              "started all_reduce of 8 float32 .*rank 1 all_gather of 8 float32");
}

// A handle dropped without wait(): still completed (its bf16 result rounded back from the fp32 sum);
// fatal when asked (the default in debug builds), naming the operation.
TEST(CommNcclSim, ADroppedHandleStillRoundsBack) {
  set_dropped_nccl_handles_fatal(false);
  run_nccl(2, [](Comm& nccl, Comm&) {
    Buffer d = on_device(std::vector<float>(16, float(nccl.rank() + 1)), DType::bf16);
    nccl.all_reduce_async(d.tensor(), ReduceOp::sum).reset();
    EXPECT_EQ(to_host(d), std::vector<float>(16, 3.0f));
  });
}

TEST(CommNcclSimDeathTest, ADroppedHandleIsFatalWhenAsked) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        set_dropped_nccl_handles_fatal(true);
        run_nccl(2, [](Comm& nccl, Comm&) {
          Buffer d = on_device(std::vector<float>(16, 1.0f));
          nccl.all_reduce_async(d.tensor(), ReduceOp::sum).reset();
        });
      },
      "the handle of NCCL all_reduce of 16 fp32 on group 'nccl' .* was dropped without wait\\(\\)");
}

// Events are taken from a pool, not made per operation: a warm communicator whose operations
// complete makes none.
TEST(CommNcclSim, OperationsReuseTheirEvents) {
  run_nccl(2, [](Comm& nccl, Comm& host) {
    Buffer d = on_device(std::vector<float>(8, 1.0f));
    for (int i = 0; i < 3; ++i) {
      nccl.all_reduce_async(d.tensor(), ReduceOp::max)->wait();
      to_host(d);
    }
    host.barrier();
    const int64_t before = cuda_sim::events_created();
    for (int i = 0; i < 20; ++i) {
      nccl.all_reduce_async(d.tensor(), ReduceOp::max)->wait();
      to_host(d);
    }
    host.barrier();
    EXPECT_LE(cuda_sim::events_created() - before, 4) << "events made by 20 warm operations on 2 ranks";
  });
}

}  // namespace
}  // namespace llmtrain::parallel
