// The SIMT simulator (kernels/cuda/sim/): each CUDA feature the kernels use gives CUDA's answer,
// and the bugs a CPU-only project cannot otherwise see give a wrong answer or kill the process.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "kernels/cuda/sim/sim_rules.h"
#include "tests/kernels/sim/device_array.h"
#include "tests/kernels/sim/sim_test_kernels.h"

namespace llmtrain::cuda_sim_test {
namespace {

// Distinct values on every call, so that shared memory left over from an earlier launch never
// holds what a racing read expects.
std::vector<float> fresh_values(int n) {
  static int calls = 0;
  ++calls;
  std::vector<float> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = float(calls * 10000 + i * 3 + 1);
  return v;
}

// These tests are of CUDA's semantics inside kernels, launched on the legacy default stream for
// brevity, which llmtrain's own code may not use (the simulator refuses it unless allowed).
class CudaSim : public ::testing::Test {
  cuda_sim::LegacyStreamAllowed legacy_;
};

TEST_F(CudaSim, BarrierOrdersSharedMemory) {
  const int n = 256;
  const std::vector<float> in = fresh_values(n);
  DeviceArray<float> din(in), dout(static_cast<size_t>(n));
  ASSERT_EQ(reverse_block(din.get(), dout.get(), n), cudaSuccess);
  const std::vector<float> out = dout.host();
  for (int i = 0; i < n; ++i) ASSERT_EQ(out[size_t(i)], in[size_t(n - 1 - i)]) << i;
}

TEST_F(CudaSim, PlantedMissingSyncthreadsGivesAWrongAnswer) {
  // reverse_missing_sync_kernel is reverse_kernel without its __syncthreads: thread i reads
  // tile[n-1-i] before thread n-1-i has written it, for every i < n/2.
  const int n = 256;
  const std::vector<float> in = fresh_values(n);
  DeviceArray<float> din(in), dout(static_cast<size_t>(n));
  ASSERT_EQ(reverse_block_missing_sync(din.get(), dout.get(), n), cudaSuccess);
  const std::vector<float> out = dout.host();
  int wrong = 0;
  for (int i = 0; i < n; ++i) wrong += out[size_t(i)] != in[size_t(n - 1 - i)];
  EXPECT_EQ(wrong, n / 2);
}

TEST_F(CudaSim, PlantedMissingSyncthreadsReadingTheLowerNeighbourGivesAWrongAnswer) {
  // rotate_missing_sync_kernel: thread i reads tile[i-1] without a barrier. Block 0 runs its
  // threads in index order, so only thread 0 (reading tile[n-1]) sees a stale value; block 1 runs
  // them in reverse, so every thread but thread 0 does.
  const int n = 64, blocks = 2;
  const std::vector<float> in = fresh_values(n * blocks);
  DeviceArray<float> din(in), dout(static_cast<size_t>(n * blocks));
  ASSERT_EQ(rotate_missing_sync(din.get(), dout.get(), n, blocks), cudaSuccess);
  const std::vector<float> out = dout.host();
  int wrong[2] = {0, 0};
  for (int b = 0; b < blocks; ++b)
    for (int i = 0; i < n; ++i) wrong[b] += out[size_t(b * n + i)] != in[size_t(b * n + (i + n - 1) % n)];
  EXPECT_EQ(wrong[0], 1);
  EXPECT_EQ(wrong[1], n - 1);
}

TEST_F(CudaSim, WarpReductionsByXorAndDown) {
  const int blocks = 3;
  std::vector<float> in(static_cast<size_t>(blocks) * 32);
  std::iota(in.begin(), in.end(), 1.0f);
  DeviceArray<float> din(in), dxor(static_cast<size_t>(blocks)), ddown(static_cast<size_t>(blocks));
  ASSERT_EQ(warp_sum_xor(din.get(), dxor.get(), blocks), cudaSuccess);
  ASSERT_EQ(warp_sum_down(din.get(), ddown.get(), blocks), cudaSuccess);
  const std::vector<float> x = dxor.host(), d = ddown.host();
  for (int b = 0; b < blocks; ++b) {
    const float expect = std::accumulate(in.begin() + b * 32, in.begin() + (b + 1) * 32, 0.0f);
    EXPECT_EQ(x[size_t(b)], expect) << b;
    EXPECT_EQ(d[size_t(b)], expect) << b;
  }
}

TEST_F(CudaSim, PlantedWrongShuffleLaneGivesAWrongAnswer) {
  // warp_sum_wrong_lane_kernel is warp_sum_down_kernel with delta + 1 in its shuffle.
  const int blocks = 2;
  std::vector<float> in(static_cast<size_t>(blocks) * 32);
  std::iota(in.begin(), in.end(), 1.0f);
  DeviceArray<float> din(in), dout(static_cast<size_t>(blocks));
  ASSERT_EQ(warp_sum_wrong_lane(din.get(), dout.get(), blocks), cudaSuccess);
  const std::vector<float> out = dout.host();
  for (int b = 0; b < blocks; ++b)
    EXPECT_NE(out[size_t(b)], std::accumulate(in.begin() + b * 32, in.begin() + (b + 1) * 32, 0.0f)) << b;
}

TEST_F(CudaSim, InclusiveScanByShuffleUp) {
  const int n = 128;
  std::vector<float> in(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) in[size_t(i)] = float(i % 7);
  DeviceArray<float> din(in), dout(static_cast<size_t>(n));
  ASSERT_EQ(warp_scan_up(din.get(), dout.get(), n), cudaSuccess);
  const std::vector<float> out = dout.host();
  for (int w = 0; w < n / 32; ++w) {
    float s = 0;
    for (int l = 0; l < 32; ++l) {
      s += in[size_t(w * 32 + l)];
      ASSERT_EQ(out[size_t(w * 32 + l)], s) << w << " " << l;
    }
  }
}

TEST_F(CudaSim, ShuffleIndexWithWidthsAndOutOfRangeSources) {
  const int n = 64;
  std::vector<float> in(static_cast<size_t>(n));
  std::iota(in.begin(), in.end(), 0.0f);
  DeviceArray<float> din(in), dout(static_cast<size_t>(n));
  for (int width : {32, 8}) {
    for (int src : {0, 5, 37}) {  // 37: CUDA takes the source lane modulo width
      ASSERT_EQ(warp_broadcast(din.get(), dout.get(), n, src, width), cudaSuccess);
      const std::vector<float> out = dout.host();
      for (int i = 0; i < n; ++i) {
        const int group = i / width * width;
        ASSERT_EQ(out[size_t(i)], in[size_t(group + src % width)]) << "width " << width << " src " << src << " i " << i;
      }
    }
  }
}

TEST_F(CudaSim, Ballot) {
  const int n = 64;
  std::vector<float> in(static_cast<size_t>(n), -1.0f);
  for (int i : {0, 3, 31, 32, 63}) in[size_t(i)] = 1.0f;
  DeviceArray<float> din(in);
  DeviceArray<unsigned> dout(static_cast<size_t>(n));
  ASSERT_EQ(warp_ballot(din.get(), dout.get(), n), cudaSuccess);
  const std::vector<unsigned> out = dout.host();
  for (int i = 0; i < 32; ++i) EXPECT_EQ(out[size_t(i)], (1u << 0) | (1u << 3) | (1u << 31));
  for (int i = 32; i < 64; ++i) EXPECT_EQ(out[size_t(i)], (1u << 0) | (1u << 31));
}

TEST_F(CudaSim, AtomicsAcrossBlocks) {
  const int n = 1000;  // 8 blocks of 128, the last one partly idle
  std::vector<float> in(static_cast<size_t>(n));
  std::vector<int> in_int(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    in[size_t(i)] = float(i % 13);  // small integers: the sum is exact in any order
    in_int[size_t(i)] = (i * 7919) % 1009 - 500;
  }
  DeviceArray<float> din(in), dsum(1);
  DeviceArray<int> dint(in_int), dmax(std::vector<int>{-1000000}), dcount(1);
  ASSERT_EQ(atomics(din.get(), dint.get(), n, dsum.get(), dmax.get(), dcount.get()), cudaSuccess);
  EXPECT_EQ(dsum.host()[0], std::accumulate(in.begin(), in.end(), 0.0f));
  EXPECT_EQ(dmax.host()[0], *std::max_element(in_int.begin(), in_int.end()));
  EXPECT_EQ(dcount.host()[0], n);
}

TEST_F(CudaSim, DynamicSharedMemoryPerBlock) {
  const int blocks = 5, threads = 128;
  std::vector<float> in(static_cast<size_t>(blocks * threads));
  for (size_t i = 0; i < in.size(); ++i) in[i] = float(i % 17);
  DeviceArray<float> din(in), dout(static_cast<size_t>(blocks));
  ASSERT_EQ(block_sum_dynamic(din.get(), dout.get(), blocks, threads), cudaSuccess);
  const std::vector<float> out = dout.host();
  for (int b = 0; b < blocks; ++b)
    EXPECT_EQ(out[size_t(b)], std::accumulate(in.begin() + b * threads, in.begin() + (b + 1) * threads, 0.0f));
}

TEST_F(CudaSim, ThreeDimensionalGridOfThreeDimensionalBlocks) {
  const dim3 grid(3, 2, 2), block(4, 3, 2);
  const int total = 3 * 2 * 2 * 4 * 3 * 2;
  DeviceArray<int> dout(std::vector<int>(static_cast<size_t>(total), -1));
  ASSERT_EQ(grid_indices(dout.get(), grid, block), cudaSuccess);
  const std::vector<int> out = dout.host();
  int i = 0;
  for (int bz = 0; bz < 2; ++bz)
    for (int by = 0; by < 2; ++by)
      for (int bx = 0; bx < 3; ++bx)
        for (int tz = 0; tz < 2; ++tz)
          for (int ty = 0; ty < 3; ++ty)
            for (int tx = 0; tx < 4; ++tx)
              ASSERT_EQ(out[size_t(i++)], tx + 10 * ty + 100 * tz + 1000 * bx + 10000 * by + 100000 * bz);
}

TEST_F(CudaSim, ThreadsThatExitDoNotHoldTheBarrier) {
  const int n = 40, threads = 64;
  const std::vector<float> in = fresh_values(n);
  DeviceArray<float> din(in), dout(static_cast<size_t>(n));
  ASSERT_EQ(early_exit_then_sync(din.get(), dout.get(), n, threads), cudaSuccess);
  const std::vector<float> out = dout.host();
  for (int i = 0; i < n; ++i) ASSERT_EQ(out[size_t(i)], in[size_t(n - 1 - i)]) << i;
}

TEST_F(CudaSim, BadLaunchConfigurationIsAnErrorAndRunsNothing) {
  DeviceArray<float> dout(std::vector<float>(32, 7.0f));
  EXPECT_EQ(too_many_threads(dout.get()), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // reading the error clears it, as in CUDA
  EXPECT_EQ(dout.host()[0], 7.0f);
}

TEST_F(CudaSim, CopiesCheckWhichSideIsTheDevice) {
  std::vector<float> host(64, 1.0f);
  DeviceArray<float> d(static_cast<size_t>(64));
  EXPECT_EQ(cudaMemcpy(host.data(), d.get(), 256, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(d.get(), host.data(), 257, cudaMemcpyHostToDevice), cudaErrorInvalidValue);  // past the end
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemset(d.get(), 0, 256), cudaSuccess);
  EXPECT_EQ(cudaFree(host.data()), cudaErrorInvalidDevicePointer);
  cudaGetLastError();
}

class CudaSimDeathTest : public ::testing::Test {
  cuda_sim::LegacyStreamAllowed legacy_;
};

TEST_F(CudaSimDeathTest, HostReadOfDeviceMemoryFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  DeviceArray<float> d(std::vector<float>(16, 3.0f));
  const volatile float* p = d.get();
  EXPECT_DEATH({ [[maybe_unused]] float v = p[0]; }, "");
  EXPECT_EQ(d.host()[0], 3.0f);  // a copy may read it
}

TEST_F(CudaSimDeathTest, HostWriteOfDeviceMemoryFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  DeviceArray<float> d(static_cast<size_t>(16));
  volatile float* p = d.get();
  EXPECT_DEATH(p[0] = 1.0f, "");
}

TEST_F(CudaSimDeathTest, ShuffleNamingAnExitedLaneAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  DeviceArray<float> din(std::vector<float>(32, 1.0f)), dout(static_cast<size_t>(32));
  EXPECT_DEATH(shuffle_with_exited_lane(din.get(), dout.get(), 20),
               "thread 20 exited while lanes of its warp wait for it in __shfl_xor_sync");
}

TEST_F(CudaSimDeathTest, ThreadsWaitingOnEachOtherAbort) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  DeviceArray<float> dout(static_cast<size_t>(32));
  EXPECT_DEATH(deadlock(dout.get()), "deadlock.*0:__syncthreads.*16:__shfl_sync");
}

}  // namespace
}  // namespace llmtrain::cuda_sim_test
