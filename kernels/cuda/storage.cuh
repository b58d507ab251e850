// Device-side helpers every kernel shares: reading and writing a storage dtype (fp32, bf16, fp16;
// arithmetic is always fp32, a store rounds once to nearest even), warp and block sums, and the
// host-side switch from a Storage value (or a tensor) to the kernel's template type. With it each
// .cu file has what its entry points need: their declarations (kernels/cuda/cuda_ops.h),
// kernels/cuda/storage.h and the launch check (LT_CUDA_LAUNCHED, kernels/cuda/cuda_check.h).
//
// The rule a reader could get wrong: block_sum needs every thread of the block to call it (it has
// __syncthreads inside) and a block of a multiple of 32 threads, at most 1024.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/storage.h"

namespace llmtrain::kernels::cuda {

__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float load(const __half* p, int64_t i) { return __half2float(p[i]); }

__device__ __forceinline__ void store(float* p, int64_t i, float x) { p[i] = x; }
__device__ __forceinline__ void store(__nv_bfloat16* p, int64_t i, float x) { p[i] = __float2bfloat16_rn(x); }
__device__ __forceinline__ void store(__half* p, int64_t i, float x) { p[i] = __float2half_rn(x); }

// Four consecutive elements as one access (16 bytes of fp32, 8 of bf16 or fp16): the memory-bound
// kernels' vector loads and stores. The address must be a multiple of the group's size
// (aligned4); each element is converted as load and store convert one.
template <class T>
struct alignas(4 * sizeof(T)) Group4 {
  T e[4];
};

template <class T>
__device__ __forceinline__ bool aligned4(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % (4 * sizeof(T)) == 0;
}

// Elements before the first aligned group of p (0 to 3; the caller bounds it by its count).
template <class T>
__device__ __forceinline__ int64_t unaligned_head(const T* p) {
  return int64_t((4 - reinterpret_cast<uintptr_t>(p) / sizeof(T) % 4) % 4);
}

template <class T>
__device__ __forceinline__ void load4(const T* p, int64_t i, float (&x)[4]) {
  const Group4<T> g = *reinterpret_cast<const Group4<T>*>(p + i);
  LT_UNROLL
  for (int k = 0; k < 4; ++k) x[k] = load(g.e, k);
}

template <class T>
__device__ __forceinline__ void store4(T* p, int64_t i, const float (&x)[4]) {
  Group4<T> g;
  LT_UNROLL
  for (int k = 0; k < 4; ++k) store(g.e, k, x[k]);
  *reinterpret_cast<Group4<T>*>(p + i) = g;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int lane_mask = 16; lane_mask > 0; lane_mask /= 2) v += __shfl_xor_sync(0xffffffffu, v, lane_mask);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int lane_mask = 16; lane_mask > 0; lane_mask /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, lane_mask));
  return v;
}

// The sum of v over the block, returned to every thread.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32), warps = int(blockDim.x / 32);
  v = warp_sum(v);
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : 0.0f;
  return warp_sum(v);
}

// The maximum of v over the block, returned to every thread (same rules as block_sum).
__device__ __forceinline__ float block_max(float v) {
  __shared__ float partial[32];
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32), warps = int(blockDim.x / 32);
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : -INFINITY;
  return warp_max(v);
}

// Calls f(T{}) with T the storage type of s: the host side of a kernel templated on storage.
template <class F>
void with_storage(Storage s, F&& f) {
  switch (s) {
    case Storage::fp32:
      f(float{});
      return;
    case Storage::bf16:
      f(__nv_bfloat16{});
      return;
    case Storage::fp16:
      f(__half{});
      return;
  }
}

// Calls f(T{}) with T the storage type of a float tensor.
template <class F>
void with_storage(const Tensor& t, F&& f) {
  with_storage(storage_of(t), static_cast<F&&>(f));
}

// Grid size for n elements at `threads` per block, capped (the kernels loop over the rest).
inline unsigned blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

// Blocks of `per_block` items covering n items (kernels whose grid covers every item: a warp per
// row, a block per tile).
inline unsigned blocks_of(int64_t n, int per_block) { return unsigned((n + per_block - 1) / per_block); }

}  // namespace llmtrain::kernels::cuda
