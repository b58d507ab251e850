// Host entry points of the simulator's test kernels (tests/kernels/sim/sim_test_kernels.cu): each
// takes device pointers, launches on the default stream and returns cudaGetLastError().
#pragma once

#include <cuda_runtime_api.h>

namespace llmtrain::cuda_sim_test {

// out[i] = in[n - 1 - i] through static shared memory, one block of n <= 1024 threads.
cudaError_t reverse_block(const float* in, float* out, int n);
// The same with the __syncthreads between the write and the read left out (a planted bug).
cudaError_t reverse_block_missing_sync(const float* in, float* out, int n);
// out[b * n + i] = in[b * n + (i - 1) mod n] through shared memory, `blocks` blocks of n threads,
// with the __syncthreads left out (a planted bug whose reads go to the lower neighbour).
cudaError_t rotate_missing_sync(const float* in, float* out, int n, int blocks);
// out[block] = the sum of in[block * 32 .. + 32], one warp per block, by __shfl_xor_sync.
cudaError_t warp_sum_xor(const float* in, float* out, int blocks);
// The same by __shfl_down_sync (the sum lands in lane 0).
cudaError_t warp_sum_down(const float* in, float* out, int blocks);
// The __shfl_down_sync reduction with the planted bug: delta off by one from the tree's.
cudaError_t warp_sum_wrong_lane(const float* in, float* out, int blocks);
// out[i] = the inclusive prefix sum of in over its warp, by __shfl_up_sync (n = a multiple of 32).
cudaError_t warp_scan_up(const float* in, float* out, int n);
// out[i] = in[the warp's lane `src`], by __shfl_sync; `width` splits the warp into groups.
cudaError_t warp_broadcast(const float* in, float* out, int n, int src, int width);
// out[i] = __ballot_sync of (in[i] > 0) for the thread's warp.
cudaError_t warp_ballot(const float* in, unsigned* out, int n);
// sum += every in[i] by atomicAdd (float), max = the largest in_int by atomicMax, and count = n
// by an atomicCAS loop; `blocks` blocks of 128 threads.
cudaError_t atomics(const float* in, const int* in_int, int n, float* sum, int* max, int* count);
// out[block] = the sum of the block's `threads` values by a tree reduction in dynamic shared memory.
cudaError_t block_sum_dynamic(const float* in, float* out, int blocks, int threads);
// out[linear index of every thread of a 3-D grid of 3-D blocks] = a code of its indices.
cudaError_t grid_indices(int* out, dim3 grid, dim3 block);
// Threads beyond n exit before a __syncthreads; the others still pass it (out = in reversed).
cudaError_t early_exit_then_sync(const float* in, float* out, int n, int threads);
// A warp reduction whose mask names lanes that have exited (the simulator aborts).
cudaError_t shuffle_with_exited_lane(const float* in, float* out, int n);
// Half of a block waits at __syncthreads, the other half at a shuffle (the simulator aborts).
cudaError_t deadlock(float* out);
// A launch of 2048 threads per block (cudaErrorInvalidConfiguration, nothing runs).
cudaError_t too_many_threads(float* out);
// The same launch, its error left for the caller's check.
void launch_too_many_threads(float* out);
// out[0..32) = 1 by a kernel on `stream` (the launch's error left pending).
void launch_on(float* out, cudaStream_t stream);

}  // namespace llmtrain::cuda_sim_test
