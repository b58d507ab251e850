// Host entry points of the WMMA test kernels (tests/kernels/sim/sim_wmma_test_kernels.cu) and of the
// 48 KiB dynamic shared memory rule's: each takes device pointers, launches on the legacy default
// stream and returns cudaGetLastError() (or the first failed call's error).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace llmtrain::cuda_sim_test {

// The 16-bit type of matrix_a and matrix_b (the bytes behind the `const void*` inputs).
enum class WmmaInput { bf16, f16 };

// d = a·b + c for one 16×16×16 tile by one warp: a and b are 16×16 of `input` with leading
// dimensions lda and ldb, column-major where a_col / b_col; c is loaded and d stored with the
// layouts c_col / d_col (mem_col_major when true) and leading dimensions ldc, ldd.
cudaError_t wmma_tile_product(WmmaInput input, bool a_col, bool b_col, bool c_col, bool d_col, const void* a,
                              unsigned lda, const void* b, unsigned ldb, const float* c, unsigned ldc, float* d,
                              unsigned ldd);
// d = a·b + c, row-major, a m×k, b k×n, c and d m×n (each a multiple of 16, m·n/256 ≤ 32 warps), by
// one block: a warp per 16×16 tile of d, k/16 steps, fragments loaded from global memory or, with
// `through_shared`, from copies of a and b in dynamic shared memory (d staged there too).
cudaError_t wmma_gemm(WmmaInput input, bool through_shared, const void* a, const void* b, const float* c, float* d,
                      int m, int n, int k);
// Element-wise work on fragments, one warp, 16×16 row-major bf16 a, b and float m:
// filled = fill_fragment(3), affine = 2·m + 1 (on the accumulator's x[]), scaled = (2·a)·b (a's x[]).
cudaError_t wmma_elementwise(const void* a, const void* b, const float* m, float* filled, float* affine, float* scaled);
// Which lane slot holds which element, as this launch maps them: acc_slot[r * 16 + c] = the slot
// (lane · num_elements + i) of an accumulator holding (r, c); a_element[slot] and b_element[slot] =
// the element r · 16 + c a row-major matrix_a / matrix_b fragment's slot holds (32 · num_elements
// values each, at most 512; *num_elements = the input fragments' num_elements).
cudaError_t wmma_holders(float* acc_slot, float* a_element, float* b_element, int* num_elements);
// A planted bug: out = m with row r scaled by r + 1, written as if lane L held row L / 2 of the
// accumulator (out = x · (L / 2 + 1) element-wise): right only for a layout CUDA does not promise.
cudaError_t wmma_scale_rows_assuming_layout(const float* m, float* out);
// out = m (16×16 float) through a tile in shared memory that each lane writes 8 elements of, a
// load_matrix_sync and a store_matrix_sync there, and each lane's copy of 8 elements out;
// missing_sync 1 / 2 is the planted bug of no __syncwarp before the load / after the store.
cudaError_t wmma_shared_round_trip(const float* m, float* out, int missing_sync);

// Misuse, each fatal in the simulator (death tests):
// lane `lane` returns before the warp's mma_sync (call 0) or its first load_matrix_sync (call 1);
cudaError_t wmma_lane_returns_before(int call, int lane);
// lane 7 passes another ldm (what 0) or lane 3 another mptr (what 1) to load_matrix_sync;
cudaError_t wmma_lanes_disagree(int what);
// a load from dynamic shared memory not rounded up to 32 bytes (what 0), a bf16 load with ldm 12
// (what 1), a store with ldm 6 (what 2);
cudaError_t wmma_bad_memory(int what);
// a block of 16 threads calls load_matrix_sync;
cudaError_t wmma_partial_warp();
// lanes 0-15 wait at __syncthreads while 16-31 are at load_matrix_sync.
cudaError_t wmma_lanes_wait_elsewhere();

// Dynamic shared memory beyond 48 KiB: out[t] = t for the block's 256 threads, through `bytes` of
// dynamic shared memory. Without opt-in: a kernel no cudaFuncSetAttribute ever names. With:
// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, attribute) first
// (its error returned if it fails), then the launch.
cudaError_t shared_without_opt_in(size_t bytes, float* out);
cudaError_t shared_with_opt_in(int attribute, size_t bytes, float* out);

}  // namespace llmtrain::cuda_sim_test
