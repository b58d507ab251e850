// The tiled GEMM's core, shared by every product we compute ourselves: the linear layer's fallback
// (linear.cu), the grouped expert products (moe.cu) and the simulator's cuBLASLt model
// (sim/sim_cublaslt.cu). A block of 16×16 threads accumulates a 64×64 tile of P = A·B, each thread
// a 4×4 grid of it (rows ty + 16i, columns tx + 16j), in fp32 whatever the operands' storage; the
// depth advances 16 at a time through shared memory.
//
// Operands are given by strides, so one loop serves row-major, column-major and transposed storage:
// A(m, k) = a[m·a_m + k·a_k], B(k, n) = b[k·b_k + n·b_n]. Each operand is loaded along its contiguous
// dimension (the one whose stride is 1), so a warp's loads stay coalesced on a GPU.
//
// The rule a reader could get wrong: both __syncthreads in the depth loop are needed: the first so
// that the tile is loaded before anyone reads it, the second so that nobody loads the next tile
// while a slower thread still reads this one. Every thread of the block must call gemm_tile.
#pragma once

#include "kernels/cuda/storage.cuh"

namespace llmtrain::kernels::cuda::gemm {

constexpr int kTile = 64, kTileK = 16, kSide = 16, kPer = kTile / kSide;

// One operand of the product: element (i, k) of A at p[i·stride_i + k·stride_k] (B: (k, j) at
// p[k·stride_k + j·stride_j], given as stride_i = stride_j), valid for i < end.
template <class T>
struct Operand {
  const T* p;
  int64_t stride_i, stride_k, end;
};

// acc[i][j] += Σ_{k ∈ [k_begin, k_end)} A(m0 + ty + 16i, k) · B(k, n0 + tx + 16j), rows of A at or
// past a.end and columns of B at or past b.end reading 0.
template <class TA, class TB>
__device__ __forceinline__ void gemm_tile(float (&acc)[kPer][kPer], Operand<TA> a, int64_t m0, Operand<TB> b,
                                          int64_t n0, int64_t k_begin, int64_t k_end) {
  __shared__ float as[kTileK][kTile + 1];  // as[k][m]
  __shared__ float bs[kTileK][kTile + 1];  // bs[k][n]
  const int tx = int(threadIdx.x), ty = int(threadIdx.y), tid = ty * kSide + tx;
  const bool a_k_fast = a.stride_k == 1, b_k_fast = b.stride_k == 1;
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kTileK) {
    for (int e = tid; e < kTileK * kTile; e += kSide * kSide) {
      const int ka = a_k_fast ? e % kTileK : e / kTile, ma = a_k_fast ? e / kTileK : e % kTile;
      const int64_t m = m0 + ma, k = k0 + ka;
      as[ka][ma] = m < a.end && k < k_end ? load(a.p, m * a.stride_i + k * a.stride_k) : 0.0f;
      const int kb = b_k_fast ? e % kTileK : e / kTile, nb = b_k_fast ? e / kTileK : e % kTile;
      const int64_t n = n0 + nb, kn = k0 + kb;
      bs[kb][nb] = n < b.end && kn < k_end ? load(b.p, n * b.stride_i + kn * b.stride_k) : 0.0f;
    }
    __syncthreads();
    for (int kk = 0; kk < kTileK; ++kk) {
      float av[kPer], bv[kPer];
      for (int i = 0; i < kPer; ++i) av[i] = as[kk][ty + kSide * i];
      for (int j = 0; j < kPer; ++j) bv[j] = bs[kk][tx + kSide * j];
      for (int i = 0; i < kPer; ++i)
        for (int j = 0; j < kPer; ++j) acc[i][j] += av[i] * bv[j];
    }
    __syncthreads();
  }
}

__device__ __forceinline__ void gemm_zero(float (&acc)[kPer][kPer]) {
  for (int i = 0; i < kPer; ++i)
    for (int j = 0; j < kPer; ++j) acc[i][j] = 0.0f;
}

// This thread's rows and columns of the tile at (m0, n0): row m0 + row(i), column n0 + col(j).
__device__ __forceinline__ int tile_row(int i) { return int(threadIdx.y) + kSide * i; }
__device__ __forceinline__ int tile_col(int j) { return int(threadIdx.x) + kSide * j; }

}  // namespace llmtrain::kernels::cuda::gemm
