// Kernels that exercise the SIMT simulator (tests/kernels/sim/test_sim.cpp): barriers, shared
// memory, every shuffle, votes, atomics, grids, and planted bugs.
//
// The rule a reader could get wrong: the `_missing_sync` and `_wrong_lane` kernels are wrong on
// purpose and stay wrong. Their tests assert that the result IS wrong: that proves the simulator
// makes such a bug visible, instead of letting a racy kernel pass by luck.
#include "kernels/cuda/cuda_common.cuh"
#include "tests/kernels/sim/sim_test_kernels.h"

namespace llmtrain::cuda_sim_test {
namespace {

__global__ void reverse_kernel(const float* __restrict__ in, float* __restrict__ out, int n) {
  __shared__ float tile[1024];
  const int i = int(threadIdx.x);
  tile[i] = in[i];
  __syncthreads();
  out[i] = tile[n - 1 - i];
}

__global__ void reverse_missing_sync_kernel(const float* __restrict__ in, float* __restrict__ out, int n) {
  __shared__ float tile[1024];
  const int i = int(threadIdx.x);
  tile[i] = in[i];
  // planted bug: no __syncthreads() here
  out[i] = tile[n - 1 - i];
}

__global__ void rotate_missing_sync_kernel(const float* __restrict__ in, float* __restrict__ out, int n) {
  __shared__ float tile[1024];
  const int i = int(threadIdx.x), base = int(blockIdx.x) * n;
  tile[i] = in[base + i];
  // planted bug: no __syncthreads() here
  out[base + i] = tile[(i + n - 1) % n];
}

__global__ void warp_sum_xor_kernel(const float* __restrict__ in, float* __restrict__ out) {
  float v = in[blockIdx.x * 32 + threadIdx.x];
  for (int mask = 16; mask > 0; mask /= 2) v += __shfl_xor_sync(0xffffffffu, v, mask);
  if (threadIdx.x == 31) out[blockIdx.x] = v;  // every lane holds the sum
}

__global__ void warp_sum_down_kernel(const float* __restrict__ in, float* __restrict__ out) {
  float v = in[blockIdx.x * 32 + threadIdx.x];
  for (int delta = 16; delta > 0; delta /= 2) v += __shfl_down_sync(0xffffffffu, v, unsigned(delta));
  if (threadIdx.x == 0) out[blockIdx.x] = v;
}

__global__ void warp_sum_wrong_lane_kernel(const float* __restrict__ in, float* __restrict__ out) {
  float v = in[blockIdx.x * 32 + threadIdx.x];
  // planted bug: the source lane is one too far at every level of the tree
  for (int delta = 16; delta > 0; delta /= 2) v += __shfl_down_sync(0xffffffffu, v, unsigned(delta + 1));
  if (threadIdx.x == 0) out[blockIdx.x] = v;
}

__global__ void warp_scan_up_kernel(const float* __restrict__ in, float* __restrict__ out) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  const int lane = int(threadIdx.x % 32);
  float v = in[i];
  for (int delta = 1; delta < 32; delta *= 2) {
    const float other = __shfl_up_sync(0xffffffffu, v, unsigned(delta));
    if (lane >= delta) v += other;
  }
  out[i] = v;
}

__global__ void warp_broadcast_kernel(const float* __restrict__ in, float* __restrict__ out, int src, int width) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  out[i] = __shfl_sync(0xffffffffu, in[i], src, width);
}

__global__ void warp_ballot_kernel(const float* __restrict__ in, unsigned* __restrict__ out) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  out[i] = __ballot_sync(0xffffffffu, in[i] > 0.0f);
}

__global__ void atomics_kernel(const float* __restrict__ in, const int* __restrict__ in_int, int n, float* sum,
                               int* max, int* count) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  atomicAdd(sum, in[i]);
  atomicMax(max, in_int[i]);
  int old = *count, assumed = 0;
  do {
    assumed = old;
    old = atomicCAS(count, assumed, assumed + 1);
  } while (old != assumed);
}

__global__ void block_sum_dynamic_kernel(const float* __restrict__ in, float* __restrict__ out) {
  LT_DYNAMIC_SHARED(float, partial);
  const unsigned t = threadIdx.x;
  partial[t] = in[blockIdx.x * blockDim.x + t];
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (t < half) partial[t] += partial[t + half];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = partial[0];
}

__global__ void grid_indices_kernel(int* out) {
  const unsigned block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  const unsigned thread = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  out[block * blockDim.x * blockDim.y * blockDim.z + thread] =
      int(threadIdx.x + 10 * threadIdx.y + 100 * threadIdx.z + 1000 * blockIdx.x + 10000 * blockIdx.y +
          100000 * blockIdx.z);
}

__global__ void early_exit_kernel(const float* __restrict__ in, float* __restrict__ out, int n) {
  __shared__ float tile[1024];
  const int i = int(threadIdx.x);
  if (i >= n) return;
  tile[i] = in[i];
  __syncthreads();
  out[i] = tile[n - 1 - i];
}

__global__ void shuffle_exited_kernel(const float* __restrict__ in, float* __restrict__ out, int n) {
  const int i = int(threadIdx.x);
  if (i >= n) return;
  float v = in[i];
  for (int mask = 16; mask > 0; mask /= 2) v += __shfl_xor_sync(0xffffffffu, v, mask);
  out[i] = v;
}

__global__ void deadlock_kernel(float* out) {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    out[threadIdx.x] = __shfl_sync(0xffffffffu, 1.0f, 0);
  }
}

}  // namespace

cudaError_t reverse_block(const float* in, float* out, int n) {
  LT_LAUNCH(1, n, 0, nullptr, reverse_kernel)(in, out, n);
  return cudaGetLastError();
}
cudaError_t reverse_block_missing_sync(const float* in, float* out, int n) {
  LT_LAUNCH(1, n, 0, nullptr, reverse_missing_sync_kernel)(in, out, n);
  return cudaGetLastError();
}
cudaError_t rotate_missing_sync(const float* in, float* out, int n, int blocks) {
  LT_LAUNCH(blocks, n, 0, nullptr, rotate_missing_sync_kernel)(in, out, n);
  return cudaGetLastError();
}
cudaError_t warp_sum_xor(const float* in, float* out, int blocks) {
  LT_LAUNCH(blocks, 32, 0, nullptr, warp_sum_xor_kernel)(in, out);
  return cudaGetLastError();
}
cudaError_t warp_sum_down(const float* in, float* out, int blocks) {
  LT_LAUNCH(blocks, 32, 0, nullptr, warp_sum_down_kernel)(in, out);
  return cudaGetLastError();
}
cudaError_t warp_sum_wrong_lane(const float* in, float* out, int blocks) {
  LT_LAUNCH(blocks, 32, 0, nullptr, warp_sum_wrong_lane_kernel)(in, out);
  return cudaGetLastError();
}
cudaError_t warp_scan_up(const float* in, float* out, int n) {
  LT_LAUNCH(n / 64 > 0 ? n / 64 : 1, n >= 64 ? 64 : n, 0, nullptr, warp_scan_up_kernel)(in, out);
  return cudaGetLastError();
}
cudaError_t warp_broadcast(const float* in, float* out, int n, int src, int width) {
  LT_LAUNCH(n / 32, 32, 0, nullptr, warp_broadcast_kernel)(in, out, src, width);
  return cudaGetLastError();
}
cudaError_t warp_ballot(const float* in, unsigned* out, int n) {
  LT_LAUNCH(n / 32, 32, 0, nullptr, warp_ballot_kernel)(in, out);
  return cudaGetLastError();
}
cudaError_t atomics(const float* in, const int* in_int, int n, float* sum, int* max, int* count) {
  LT_LAUNCH((n + 127) / 128, 128, 0, nullptr, atomics_kernel)(in, in_int, n, sum, max, count);
  return cudaGetLastError();
}
cudaError_t block_sum_dynamic(const float* in, float* out, int blocks, int threads) {
  LT_LAUNCH(blocks, threads, size_t(threads) * sizeof(float), nullptr, block_sum_dynamic_kernel)(in, out);
  return cudaGetLastError();
}
cudaError_t grid_indices(int* out, dim3 grid, dim3 block) {
  LT_LAUNCH(grid, block, 0, nullptr, grid_indices_kernel)(out);
  return cudaGetLastError();
}
cudaError_t early_exit_then_sync(const float* in, float* out, int n, int threads) {
  LT_LAUNCH(1, threads, 0, nullptr, early_exit_kernel)(in, out, n);
  return cudaGetLastError();
}
cudaError_t shuffle_with_exited_lane(const float* in, float* out, int n) {
  LT_LAUNCH(1, 32, 0, nullptr, shuffle_exited_kernel)(in, out, n);
  return cudaGetLastError();
}
cudaError_t deadlock(float* out) {
  LT_LAUNCH(1, 32, 0, nullptr, deadlock_kernel)(out);
  return cudaGetLastError();
}
cudaError_t too_many_threads(float* out) {
  launch_too_many_threads(out);
  return cudaGetLastError();
}
void launch_too_many_threads(float* out) { LT_LAUNCH(1, 2048, 0, nullptr, deadlock_kernel)(out); }

__global__ void fill_kernel(float* out) { out[threadIdx.x] = 1.0f; }
void launch_on(float* out, cudaStream_t stream) { LT_LAUNCH(1, 32, 0, stream, fill_kernel)(out); }

}  // namespace llmtrain::cuda_sim_test
