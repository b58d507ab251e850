// The in-process communicator (parallel/comm/comm_threads.h): every operation at 1 to 4 ranks against
// results computed here from each rank's known input; reductions of every dtype, bf16/fp16 rounded
// once, in rank order and bitwise equal on every rank; async forms; message order by tag and
// both sides sending first; split; and the failures: a timeout naming what it waited for, a
// throwing or returning rank ending every other rank's wait at once, mismatched calls reported.
//
// Tests that a failure ends waits "at once" give the ranks a timeout far longer than ctest's: if
// the waits only ended by timing out, ctest would fail the test.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <latch>
#include <random>
#include <tuple>
#include <vector>

#include "common/error.h"
#include "kernels/dtype_convert.h"
#include "parallel/comm/comm_threads.h"

namespace llmtrain::parallel {
namespace {

using kernels::DType;
using ::testing::HasSubstr;

constexpr double kNeverTimesOut = 3600.0;  // far beyond ctest's limit for this test

template <typename T>
Tensor view(std::vector<T>& v, DType dtype = kernels::DTypeOf<T>::value) {
  return Tensor(v.data(), dtype, {static_cast<int64_t>(v.size())});
}

// The message and hint of the Error `f` throws.
struct Caught {
  std::string what = "(no error)", hint;
};
Caught error_of(const std::function<void()>& f) {
  Caught c;
  try {
    f();
  } catch (const Error& e) {
    c.what = e.what();
    c.hint = e.hint();
  }
  return c;
}

class CommThreads : public ::testing::TestWithParam<int> {
 protected:
  int n() const { return GetParam(); }
};

// Sum (wrapping in T) and max of each rank's value(r, i), every dtype, against int64 arithmetic.
template <typename T>
void check_sum_and_max(Comm& world, DType dtype, const std::function<int64_t(int, int64_t)>& value) {
  const int64_t count = 1009;
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
    std::vector<T> buf(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) buf[static_cast<size_t>(i)] = static_cast<T>(value(world.rank(), i));
    world.all_reduce(view(buf, dtype), op);
    for (int64_t i = 0; i < count; ++i) {
      int64_t want = op == ReduceOp::sum ? 0 : value(0, i);
      for (int r = 0; r < world.size(); ++r)
        want = op == ReduceOp::sum ? want + value(r, i) : std::max(want, value(r, i));
      ASSERT_EQ(buf[static_cast<size_t>(i)], static_cast<T>(want))
          << to_string(op) << " of " << kernels::to_string(dtype) << " element " << i << " on rank " << world.rank();
    }
  }
}

TEST_P(CommThreads, AllReduceSumsAndMaxesEveryDtype) {
  run_ranks_in_threads(n(), [](Comm& world) {
    // fp32 values are integers, so that every order of summation gives the same exact sum.
    check_sum_and_max<float>(world, DType::fp32, [](int r, int64_t i) { return (r + 1) * (i % 7) - 3 * r; });
    check_sum_and_max<int32_t>(world, DType::int32, [](int r, int64_t i) { return (r + 1) * i * 37 - 11 * r; });
    check_sum_and_max<int64_t>(world, DType::int64,
                               [](int r, int64_t i) { return (int64_t(1) << 40) * (r + 1) + i - r; });
    // uint8 and uint16 sums wrap around, as MPI's do.
    check_sum_and_max<uint8_t>(world, DType::uint8, [](int r, int64_t i) { return (r * 90 + i) % 256; });
    check_sum_and_max<uint16_t>(world, DType::uint16, [](int r, int64_t i) { return (r * 30000 + i * 13) % 65536; });
  });
}

TEST_P(CommThreads, ReductionsAreInRankOrderAndBitwiseEqualOnEveryRank) {
  // Arbitrary floats, whose sum depends on the order of the additions.
  const int n = this->n();
  const size_t count = 4099;
  std::vector<std::vector<float>> inputs(static_cast<size_t>(n), std::vector<float>(count));
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& in : inputs)
    for (float& x : in) x = normal(rng) * 1e3f;
  std::vector<float> in_order(count);  // ((x0 + x1) + x2) + x3
  for (size_t i = 0; i < count; ++i) {
    float acc = inputs[0][i];
    for (int r = 1; r < n; ++r) acc += inputs[static_cast<size_t>(r)][i];
    in_order[i] = acc;
  }
  std::vector<std::vector<float>> sums(static_cast<size_t>(n)), avgs(static_cast<size_t>(n)),
      scattered(static_cast<size_t>(n));
  run_ranks_in_threads(n, [&](Comm& world) {
    const size_t me = size_t(world.rank());
    sums[me] = avgs[me] = inputs[me];
    world.all_reduce(view(sums[me]), ReduceOp::sum);
    world.all_reduce(view(avgs[me]), ReduceOp::avg);
    std::vector<float> padded = inputs[me];
    padded.resize(count * static_cast<size_t>(n), 1.0f);  // reduce_scatter needs n equal blocks
    scattered[me].resize(count);
    world.reduce_scatter(view(padded), view(scattered[me]), ReduceOp::sum);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(0, std::memcmp(sums[static_cast<size_t>(r)].data(), in_order.data(), count * sizeof(float)))
        << "sum on rank " << r;
    std::vector<float> avg(count);
    for (size_t i = 0; i < count; ++i) avg[i] = in_order[i] / float(n);
    EXPECT_EQ(0, std::memcmp(avgs[static_cast<size_t>(r)].data(), avg.data(), count * sizeof(float)))
        << "avg on rank " << r;
    EXPECT_EQ(0, std::memcmp(avgs[static_cast<size_t>(r)].data(), avgs[0].data(), count * sizeof(float)))
        << "rank " << r;
  }
  // Rank 0's block of a reduce-scatter is the sum of every rank's first `count` elements.
  EXPECT_EQ(0, std::memcmp(scattered[0].data(), in_order.data(), count * sizeof(float)));
}

TEST_P(CommThreads, SixteenBitFloatsAreReducedInFp32AndRoundedOnce) {
  // Rank 0 holds 1.0, every other rank half a unit in the last place of 1.0: rounding after
  // every addition would stay at 1.0; rounding once gives 1 + (n-1)/2 ulp, ties to even.
  // bf16: 1.0 = 0x3f80, ulp 2^-7, 2^-8 = 0x3b80. fp16: 1.0 = 0x3c00, ulp 2^-10, 2^-11 = 0x1000.
  const uint16_t ulps[] = {0, 0, 1, 2};  // 1 + 0, 0.5 (tie to even 0), 1, 1.5 (tie to even 2) ulp
  struct Case {
    DType dtype;
    uint16_t one, half_ulp;
    uint16_t avg_of_1_to_n[4];  // 1, 1.5, 2, 2.5
    uint16_t max_of_1_to_n[4];  // 1, 2, 3, 4
  };
  const Case cases[] = {
      {DType::bf16, 0x3f80, 0x3b80, {0x3f80, 0x3fc0, 0x4000, 0x4020}, {0x3f80, 0x4000, 0x4040, 0x4080}},
      {DType::fp16, 0x3c00, 0x1000, {0x3c00, 0x3e00, 0x4000, 0x4100}, {0x3c00, 0x4000, 0x4200, 0x4400}}};
  const int n = this->n();
  run_ranks_in_threads(n, [&](Comm& world) {
    const int r = world.rank();
    for (const Case& c : cases) {
      SCOPED_TRACE(kernels::to_string(c.dtype));
      std::vector<uint16_t> sum(3, r == 0 ? c.one : c.half_ulp);
      world.all_reduce(view(sum, c.dtype), ReduceOp::sum);
      EXPECT_EQ(sum, std::vector<uint16_t>(3, uint16_t(c.one + ulps[n - 1])));
      // One plus r: avg and max, in the 16-bit encoding of 1, 2, 3, 4.
      const uint16_t one_to_four[] = {c.one, c.max_of_1_to_n[1], c.max_of_1_to_n[2], c.max_of_1_to_n[3]};
      std::vector<uint16_t> avg(2, one_to_four[r]), max = avg;
      world.all_reduce(view(avg, c.dtype), ReduceOp::avg);
      world.all_reduce(view(max, c.dtype), ReduceOp::max);
      EXPECT_EQ(avg, std::vector<uint16_t>(2, c.avg_of_1_to_n[n - 1]));
      EXPECT_EQ(max, std::vector<uint16_t>(2, c.max_of_1_to_n[n - 1]));
    }
  });
}

TEST_P(CommThreads, SixteenBitSumsInSixteenBitsRoundEveryAddition) {
  // Accumulate::in_dtype adds in rank order and rounds each partial sum: 1.0 plus half an ulp is a
  // tie that rounds back to 1.0, every time (rounding once would give 1 + (n-1)/2 ulp).
  const int n = this->n();
  run_ranks_in_threads(n, [&](Comm& world) {
    const int r = world.rank();
    for (auto [dtype, one, half_ulp] : {std::tuple{DType::bf16, uint16_t(0x3f80), uint16_t(0x3b80)},
                                        std::tuple{DType::fp16, uint16_t(0x3c00), uint16_t(0x1000)}}) {
      SCOPED_TRACE(kernels::to_string(dtype));
      const Reduction sum(ReduceOp::sum, Accumulate::in_dtype);
      std::vector<uint16_t> all(3, r == 0 ? one : half_ulp);
      world.all_reduce(view(all, dtype), sum);
      EXPECT_EQ(all, std::vector<uint16_t>(3, one));
      std::vector<uint16_t> in(size_t(n) * 2, r == 0 ? one : half_ulp), out(2);
      world.reduce_scatter(view(in, dtype), view(out, dtype), sum);
      EXPECT_EQ(out, std::vector<uint16_t>(2, one));
      // avg: the 16-bit sum 1.0, divided by n and rounded once more.
      std::vector<uint16_t> avg(2, r == 0 ? one : half_ulp);
      world.all_reduce(view(avg, dtype), Reduction(ReduceOp::avg, Accumulate::in_dtype));
      const float q = 1.0f / float(n);
      const uint16_t want = dtype == DType::bf16 ? kernels::fp32_to_bf16(q) : kernels::fp32_to_fp16(q);
      EXPECT_EQ(avg, std::vector<uint16_t>(2, want));
    }
  });
}

TEST_P(CommThreads, ReduceScatterGivesEachRankTheReductionOfItsBlock) {
  const int n = this->n();
  const int64_t m = 37;  // block size
  // Rank s's element j of block b: 100 s + 7 b + j (small integers: exact in fp32).
  auto value = [](int s, int64_t b, int64_t j) { return float(100 * s + 7 * b + j); };
  run_ranks_in_threads(n, [&](Comm& world) {
    const int r = world.rank();
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(std::string(to_string(op)) + (in_place ? " in place" : ""));
        std::vector<float> in(static_cast<size_t>(n * m)), separate(static_cast<size_t>(m));
        for (int64_t b = 0; b < n; ++b)
          for (int64_t j = 0; j < m; ++j) in[static_cast<size_t>(b * m + j)] = value(r, b, j);
        // In place: the output is this rank's own block of the input (as ZeRO reduces a bucket).
        Tensor out = in_place ? view(in).flat(r * m, m) : view(separate);
        world.reduce_scatter(view(in), out, op);
        for (int64_t j = 0; j < m; ++j) {
          float want = op == ReduceOp::max ? value(n - 1, r, j) : 0.0f;
          if (op != ReduceOp::max)
            for (int s = 0; s < n; ++s) want += value(s, r, j);
          if (op == ReduceOp::avg) want /= float(n);
          ASSERT_EQ(out.ptr<float>()[j], want) << "element " << j << " on rank " << r;
        }
      }
    }
  });
}

TEST_P(CommThreads, AllGatherConcatenatesEveryRanksInputInRankOrder) {
  const int n = this->n();
  const int64_t m = 23;
  run_ranks_in_threads(n, [&](Comm& world) {
    const int r = world.rank();
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(in_place ? "in place" : "separate");
      std::vector<int64_t> in(static_cast<size_t>(m)), out(static_cast<size_t>(n * m), -1);
      for (int64_t j = 0; j < m; ++j) in[static_cast<size_t>(j)] = 1000 * r + j;
      Tensor input = view(in);
      if (in_place) {  // the input is this rank's block of the output (as ZeRO gathers shards)
        std::copy(in.begin(), in.end(), out.begin() + r * m);
        input = view(out).flat(r * m, m);
      }
      world.all_gather(input, view(out));
      for (int s = 0; s < n; ++s)
        for (int64_t j = 0; j < m; ++j) ASSERT_EQ(out[static_cast<size_t>(s * m + j)], 1000 * s + j) << "rank " << r;
    }
  });
}

TEST_P(CommThreads, BroadcastCopiesTheRootsBufferToEveryRank) {
  const int n = this->n();
  run_ranks_in_threads(n, [&](Comm& world) {
    for (int root = 0; root < n; ++root) {
      std::vector<uint8_t> buf(301);
      for (size_t i = 0; i < buf.size(); ++i) buf[i] = uint8_t(world.rank() * 31 + i);
      world.broadcast(view(buf), root);
      for (size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], uint8_t(root * 31 + i)) << "root " << root;
    }
  });
}

TEST_P(CommThreads, AllToAllSendsBlockSOfRankRToBlockROfRankS) {
  const int n = this->n();
  const int64_t m = 5;
  run_ranks_in_threads(n, [&](Comm& world) {
    const int r = world.rank();
    for (bool same_buffer : {false, true}) {
      SCOPED_TRACE(same_buffer ? "in == out" : "separate");
      std::vector<int32_t> in(static_cast<size_t>(n * m)), separate(static_cast<size_t>(n * m), -1);
      for (int s = 0; s < n; ++s)  // block s is for rank s
        for (int64_t j = 0; j < m; ++j) in[static_cast<size_t>(s * m + j)] = int32_t(1000 * r + 10 * s + j);
      std::vector<int32_t>& out = same_buffer ? in : separate;
      world.all_to_all(view(in), view(out));
      for (int s = 0; s < n; ++s)  // block s came from rank s, which addressed it to r
        for (int64_t j = 0; j < m; ++j) ASSERT_EQ(out[static_cast<size_t>(s * m + j)], int32_t(1000 * s + 10 * r + j));
    }
  });
}

TEST_P(CommThreads, BarrierReturnsOnlyOnceEveryRankHasReachedIt) {
  const int n = this->n();
  std::atomic<int> arrived{0};
  run_ranks_in_threads(n, [&](Comm& world) {
    for (int round = 1; round <= 3; ++round) {
      arrived.fetch_add(1);
      world.barrier();
      EXPECT_GE(arrived.load(), round * n) << "round " << round << " on rank " << world.rank();
      world.barrier();  // nobody starts the next round before every rank has checked this one
    }
  });
}

TEST_P(CommThreads, AsyncFormsCompleteByTheirWait) {
  const int n = this->n();
  run_ranks_in_threads(n, [&](Comm& world) {
    const int r = world.rank();
    std::vector<float> reduced(8, float(r + 1)), gathered(static_cast<size_t>(n)), mine(1, float(r)), scattered(2);
    std::vector<float> to_scatter(static_cast<size_t>(2 * n), 1.0f), bcast(3, float(r)),
        a2a_in(static_cast<size_t>(n), float(r)), a2a_out(static_cast<size_t>(n));
    std::vector<float> empty;
    std::vector<WorkHandle> works;
    works.push_back(world.all_reduce_async(view(reduced), ReduceOp::sum));
    works.push_back(world.all_gather_async(view(mine), view(gathered)));
    works.push_back(world.reduce_scatter_async(view(to_scatter), view(scattered), ReduceOp::avg));
    works.push_back(world.broadcast_async(view(bcast), n - 1));
    works.push_back(world.all_to_all_async(view(a2a_in), view(a2a_out)));
    works.push_back(world.barrier_async());
    works.push_back(world.all_reduce_async(view(empty), ReduceOp::max));
    std::vector<float> sent(4, float(r)), received(4, -1.0f);
    if (n > 1) {  // a ring: send to the next rank, receive from the previous one
      works.push_back(world.send_async(view(sent), (r + 1) % n, 7));
      works.push_back(world.recv_async(view(received), (r + n - 1) % n, 7));
    }
    for (auto& w : works) w->wait();
    for (auto& w : works) EXPECT_TRUE(w->done());
    world.progress();
    EXPECT_EQ(reduced, std::vector<float>(8, float(n * (n + 1) / 2)));
    for (int s = 0; s < n; ++s) EXPECT_EQ(gathered[static_cast<size_t>(s)], float(s));
    EXPECT_EQ(scattered, std::vector<float>(2, 1.0f));
    EXPECT_EQ(bcast, std::vector<float>(3, float(n - 1)));
    for (int s = 0; s < n; ++s) EXPECT_EQ(a2a_out[static_cast<size_t>(s)], float(s));
    if (n > 1) {
      EXPECT_EQ(received, std::vector<float>(4, float((r + n - 1) % n)));
    }
  });
}

TEST_P(CommThreads, AnAsyncCollectiveCompletesOnceTheLastRankStartsIt) {
  const int n = this->n();
  if (n == 1) {  // the only rank is the last to start it: done at once
    run_ranks_in_threads(1, [&](Comm& world) {
      std::vector<float> buf(4, 1.0f);
      WorkHandle w = world.all_reduce_async(view(buf), ReduceOp::sum);
      EXPECT_TRUE(w->done());
      w->wait();
      EXPECT_EQ(buf, std::vector<float>(4, 1.0f));
    });
    return;
  }
  std::latch rank0_started(1);
  run_ranks_in_threads(n, [&](Comm& world) {
    std::vector<float> buf(4, 1.0f);
    if (world.rank() == 0) {
      WorkHandle w;
      {
        struct Release {  // the others start once rank 0 has looked, even if it failed to
          std::latch& started;
          ~Release() { started.count_down(); }
        } release{rank0_started};
        w = world.all_reduce_async(view(buf), ReduceOp::sum);
        EXPECT_FALSE(w->done()) << "completed before the other ranks started it";
        EXPECT_EQ(buf, std::vector<float>(4, 1.0f)) << "written before the other ranks started it";
      }
      w->wait();
    } else {
      rank0_started.wait();
      world.all_reduce(view(buf), ReduceOp::sum);
    }
    EXPECT_EQ(buf, std::vector<float>(4, float(n)));
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, CommThreads, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param); });

// --- point-to-point ------------------------------------------------------------------------------

TEST(CommThreadsP2p, MessagesOfOnePairAndTagArriveInOrderAndTagsPassEachOther) {
  for (int n = 2; n <= 4; ++n) {
    SCOPED_TRACE(n);
    run_ranks_in_threads(n, [&](Comm& world) {
      const int r = world.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
      std::vector<int32_t> a{100 * r + 1}, b{100 * r + 2}, c{100 * r + 3}, got(1);
      std::vector<WorkHandle> sends;
      sends.push_back(world.send_async(view(a), next, 1));
      sends.push_back(world.send_async(view(b), next, 1));
      sends.push_back(world.send_async(view(c), next, 2));
      world.recv(view(got), prev, 2);  // tag 2 was sent last but is received first
      EXPECT_EQ(got[0], 100 * prev + 3);
      world.recv(view(got), prev, 1);
      EXPECT_EQ(got[0], 100 * prev + 1);
      world.recv(view(got), prev, 1);
      EXPECT_EQ(got[0], 100 * prev + 2);
      wait_all(sends);
    });
  }
}

TEST(CommThreadsP2p, EveryRankSendingFirstThenReceivingDoesNotDeadlock) {
  for (int n = 2; n <= 4; ++n) {
    SCOPED_TRACE(n);
    run_ranks_in_threads(n, [&](Comm& world) {
      const int r = world.rank();
      std::vector<std::vector<float>> out(static_cast<size_t>(n)), in(static_cast<size_t>(n));
      std::vector<WorkHandle> sends;
      for (int p = 0; p < n; ++p)
        if (p != r) {
          out[static_cast<size_t>(p)].assign(1000, float(10 * r + p));
          sends.push_back(world.send_async(view(out[static_cast<size_t>(p)]), p));
        }
      for (int p = 0; p < n; ++p)
        if (p != r) {
          in[static_cast<size_t>(p)].resize(1000);
          world.recv(view(in[static_cast<size_t>(p)]), p);
          EXPECT_EQ(in[static_cast<size_t>(p)], std::vector<float>(1000, float(10 * p + r))) << "from " << p;
        }
      wait_all(sends);
    });
  }
}

TEST(CommThreadsP2p, ABlockingSendCompletesOnlyWhenReceivedAsALargeMpiMessageDoes) {
  // Both ranks send first with the blocking form: under MPI this hangs for any message too large
  // to be buffered; here it always does, and the timeout says so.
  const Caught e = error_of([] {
    run_ranks_in_threads(
        2,
        [](Comm& world) {
          std::vector<float> out(4, 1.0f), in(4);
          world.send(view(out), 1 - world.rank(), 5);
          world.recv(view(in), 1 - world.rank(), 5);
        },
        0.2);
  });
  EXPECT_THAT(e.what, HasSubstr("timed out after 0.2s waiting for send(4 fp32, tag 5) to rank"));
}

// --- split ----------------------------------------------------------------------------------------

TEST(CommThreadsSplit, SameColorMakesOneGroupRankedByKeyThenRank) {
  run_ranks_in_threads(4, [](Comm& world) {
    const int r = world.rank();
    world.set_timeout(25.0);
    // Two groups by parity, ranked by descending world rank: {2, 0} and {3, 1}.
    std::unique_ptr<Comm> dp = world.split(r % 2, -r, "dp");
    EXPECT_EQ(dp->name(), "dp");
    EXPECT_EQ(dp->size(), 2);
    EXPECT_EQ(dp->rank(), r < 2 ? 1 : 0);
    EXPECT_EQ(dp->timeout(), 25.0);
    std::vector<int32_t> me{r}, members(2);
    dp->all_gather(view(me), view(members));
    EXPECT_EQ(members, (r % 2 == 0 ? std::vector<int32_t>{2, 0} : std::vector<int32_t>{3, 1}));
    // Point-to-point addresses ranks of the new group: its rank 0 sends to its rank 1.
    std::vector<int32_t> msg{r};
    if (dp->rank() == 0)
      dp->send(view(msg), 1, 4);
    else
      dp->recv(view(msg), 0, 4);
    EXPECT_EQ(msg[0], r < 2 ? r + 2 : r);

    // Equal keys keep the old order; one color for all is the whole group again.
    std::unique_ptr<Comm> all = world.split(0, 0, "all");
    EXPECT_EQ(all->rank(), r);
    EXPECT_EQ(all->size(), 4);
    // A group split from a split group; one-rank groups work like any other.
    std::unique_ptr<Comm> alone = dp->split(dp->rank(), 0, "alone");
    EXPECT_EQ(alone->size(), 1);
    std::vector<float> x{float(r)};
    alone->all_reduce(view(x), ReduceOp::sum);
    EXPECT_EQ(x[0], float(r));
    // Collectives of different groups interleave freely.
    std::vector<float> s{1.0f}, w{1.0f};
    WorkHandle in_dp = dp->all_reduce_async(view(s), ReduceOp::sum);
    world.all_reduce(view(w), ReduceOp::sum);
    in_dp->wait();
    EXPECT_EQ(s[0], 2.0f);
    EXPECT_EQ(w[0], 4.0f);
  });
}

// --- failures -------------------------------------------------------------------------------------

TEST(CommThreadsFailures, TimeoutNamesTheOperationTheGroupAndThePeer) {
  auto pp = make_thread_comms(2, "pp", 0.2);
  std::vector<float> buf(4);
  const Caught recv = error_of([&] { pp[0]->recv(view(buf), 1, 3); });  // rank 1 never sends
  EXPECT_EQ(recv.what,
            "timed out after 0.2s waiting for recv(4 fp32, tag 3) from rank 1 (world rank 1) of group 'pp' (2 ranks; "
            "this is its rank 0)");
  EXPECT_THAT(recv.hint, HasSubstr("raise the timeout"));

  auto dp = make_thread_comms(3, "dp", 0.2);
  const Caught all_reduce = error_of([&] { dp[1]->all_reduce(view(buf), ReduceOp::sum); });
  EXPECT_EQ(all_reduce.what,
            "timed out after 0.2s waiting for all_reduce(sum, 4 fp32) on group 'dp' (3 ranks; this is its rank 1)");
  // A group that timed out is unusable, and says why.
  const Caught after = error_of([&] { dp[0]->barrier(); });
  EXPECT_THAT(after.what, HasSubstr("cannot start barrier() on group 'dp'"));
  EXPECT_THAT(after.what, HasSubstr("rank 1 of the in-process job failed: timed out"));
}

TEST(CommThreadsFailures, AThrowingRankEndsEveryOtherRanksWaitAtOnce) {
  // Ranks {0, 1} and {2, 3} form groups. Rank 3 fails once the others have started waiting: rank
  // 2 for it in their group, ranks 0 and 1 in the world. Every wait ends with an error naming it.
  std::vector<std::string> seen(4);
  std::latch waiting(3);
  const Caught e = error_of([&] {
    run_ranks_in_threads(
        4,
        [&](Comm& world) {
          const int r = world.rank();
          std::unique_ptr<Comm> half = world.split(r / 2, r, "half");
          if (r == 3) {
            waiting.wait();
            throw Error("boom", "defuse it");
          }
          std::vector<float> x(16, 1.0f);
          WorkHandle w;
          {
            struct Started {  // counted down even if starting failed, so that rank 3 goes on
              std::latch& waiting;
              ~Started() { waiting.count_down(); }
            } started{waiting};
            w = r == 2 ? half->all_reduce_async(view(x), ReduceOp::sum) : world.barrier_async();
          }
          try {
            w->wait();
          } catch (const Error& waited) {
            seen[static_cast<size_t>(r)] = waited.what();
            throw;
          }
        },
        kNeverTimesOut);
  });
  EXPECT_EQ(e.what, "rank 3 of 4 in-process ranks failed: boom");
  EXPECT_EQ(e.hint, "defuse it");
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(seen[static_cast<size_t>(r)],
              fmt::format("gave up waiting for barrier() on group 'world' (4 ranks; this is its rank {}): rank 3 of "
                          "the in-process job failed: boom",
                          r));
  EXPECT_EQ(seen[2],
            "gave up waiting for all_reduce(sum, 16 fp32) on group 'half' (2 ranks; this is its rank 0): rank 3 of the "
            "in-process job failed: boom");
}

TEST(CommThreadsFailures, ARankThatReturnsWithoutJoiningIsNamedAtOnce) {
  const Caught e = error_of([] {
    run_ranks_in_threads(
        3,
        [](Comm& world) {
          if (world.rank() == 1) return;
          world.barrier();
        },
        kNeverTimesOut);
  });
  EXPECT_THAT(e.what, HasSubstr("barrier() on group 'world' (3 ranks; this is its rank"));
  EXPECT_THAT(e.what, HasSubstr("can never complete: rank 1 (world rank 1) of group 'world' returned from its "
                                "function without starting its side of it"));
}

TEST(CommThreadsFailures, MismatchedCollectivesAreReportedAndTouchNoBuffer) {
  std::vector<std::vector<float>> bufs(2);
  const Caught counts = error_of([&] {
    run_ranks_in_threads(
        2,
        [&](Comm& world) {
          std::vector<float>& x = bufs[size_t(world.rank())];
          x.assign(size_t(4 + world.rank()), 1.0f);  // 4 elements on rank 0, 5 on rank 1
          world.all_reduce(view(x), ReduceOp::sum);
        },
        kNeverTimesOut);
  });
  EXPECT_THAT(counts.what, HasSubstr("collective mismatch on group 'world' (2 ranks)"));
  EXPECT_THAT(counts.what, HasSubstr("all_reduce(sum, 4 fp32)"));
  EXPECT_THAT(counts.what, HasSubstr("all_reduce(sum, 5 fp32)"));
  EXPECT_THAT(counts.hint, HasSubstr("same collectives in the same order"));
  EXPECT_EQ(bufs[0], std::vector<float>(4, 1.0f));
  EXPECT_EQ(bufs[1], std::vector<float>(5, 1.0f));

  const Caught kinds = error_of([] {
    run_ranks_in_threads(
        2,
        [](Comm& world) {
          std::vector<float> x(2, 1.0f), y(4);
          if (world.rank() == 0)
            world.all_gather(view(x), view(y));
          else
            world.broadcast(view(x), 0);
        },
        kNeverTimesOut);
  });
  EXPECT_THAT(kinds.what, HasSubstr("collective mismatch"));
  EXPECT_THAT(kinds.what, HasSubstr("all_gather(2 fp32)"));
  EXPECT_THAT(kinds.what, HasSubstr("broadcast(2 fp32, root 0)"));

  const Caught sizes = error_of([] {
    run_ranks_in_threads(
        2,
        [](Comm& world) {
          std::vector<float> x(world.rank() == 0 ? 3 : 4);
          if (world.rank() == 0)
            world.send(view(x), 1, 9);
          else
            world.recv(view(x), 0, 9);
        },
        kNeverTimesOut);
  });
  EXPECT_THAT(sizes.what,
              HasSubstr("send/recv mismatch on group 'world' (2 ranks): rank 0 sends 3 fp32 with tag 9 and rank 1 "
                        "receives it into 4 fp32"));
}

TEST(CommThreadsFailures, NoErrorMeansNoThrowAndEveryRankRunsOnOneOpenMpThread) {
  std::vector<int> threads(3, 0);
  run_ranks_in_threads(3, [&](Comm& world) { threads[size_t(world.rank())] = omp_get_max_threads(); });
  EXPECT_EQ(threads, std::vector<int>(3, 1));
}

}  // namespace
}  // namespace llmtrain::parallel
