// Column sums on the device for the gradients of biases and norm weights: for every column j of n
// rows, K sums Σ_r terms(r, j)[k], handed to finish(j, sums). A block takes 32 columns with 32 row
// lanes each: lane y sums rows y, y + 32, ... in order, then the 32 lane sums are added in lane
// order. So every column's sum is the same on every run (no atomics), and a block reads 32
// consecutive columns of a row at once (coalesced), with many rows in flight.
//
// The rule a reader could get wrong: terms and finish are plain structs with a __device__
// operator() (not lambdas), so that nvcc and the simulator compile them alike; finish runs once per
// column, on lane 0, after every lane's sum is in shared memory.
#pragma once

#include "kernels/cuda/storage.cuh"

namespace llmtrain::kernels::cuda {

inline constexpr int kSumColumns = 32, kSumLanes = 32;

template <int K, class Terms, class Finish>
__global__ void column_sums_kernel(Terms terms, Finish finish, int64_t n, int64_t c) {
  __shared__ float part[K][kSumLanes][kSumColumns + 1];
  const int x = int(threadIdx.x) % kSumColumns, y = int(threadIdx.x) / kSumColumns;
  const int64_t j = int64_t(blockIdx.x) * kSumColumns + x;
  float acc[K];
  LT_UNROLL
  for (int k = 0; k < K; ++k) acc[k] = 0.0f;
  if (j < c) {
    LT_UNROLL_BY(4)
    for (int64_t r = y; r < n; r += kSumLanes) {
      float v[K];
      terms(r, j, v);
      LT_UNROLL
      for (int k = 0; k < K; ++k) acc[k] += v[k];
    }
  }
  LT_UNROLL
  for (int k = 0; k < K; ++k) part[k][y][x] = acc[k];
  __syncthreads();
  if (y != 0 || j >= c) return;
  float sums[K];
  LT_UNROLL
  for (int k = 0; k < K; ++k) {
    sums[k] = 0.0f;
    for (int lane = 0; lane < kSumLanes; ++lane) sums[k] += part[k][lane][x];
  }
  finish(j, sums);
}

template <int K, class Terms, class Finish>
void column_sums(Terms terms, Finish finish, int64_t n, int64_t c) {
  if (c == 0) return;
  LT_LAUNCH(unsigned((c + kSumColumns - 1) / kSumColumns), kSumColumns * kSumLanes, 0, compute_stream(),
            column_sums_kernel<K, Terms, Finish>)
  (terms, finish, n, c);
}

// finish for one gradient: dst[j] += sum, one rounding.
template <class T>
struct AddToColumn {
  T* dst;
  __device__ void operator()(int64_t j, const float* sums) const { store(dst, j, load(dst, j) + sums[0]); }
};

}  // namespace llmtrain::kernels::cuda
