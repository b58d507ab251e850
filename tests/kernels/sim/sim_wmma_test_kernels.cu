// Kernels that exercise the simulator's WMMA model (tests/kernels/sim/test_sim_wmma.cpp): tile
// products in every layout, a tiled GEMM from global and from shared memory, element-wise work on
// fragments, the per-launch element mapping, misuse the simulator must stop, and the 48 KiB dynamic
// shared memory opt-in. They are CUDA: the GPU build compiles them with nvcc.
//
// The rule a reader could get wrong: wmma_scale_rows_assuming_layout_kernel and the misuse kernels
// are wrong on purpose and stay wrong; their tests assert the wrong result or the abort, which
// proves the model catches what CUDA does not promise.
#include <cstdint>

#include "kernels/cuda/wmma.cuh"
#include "tests/kernels/sim/sim_wmma_test_kernels.h"

namespace llmtrain::cuda_sim_test {
namespace {

namespace wmma = nvcuda::wmma;

// The 2 in the element-wise test's 2·a, on a bf16 element.
__device__ __forceinline__ __nv_bfloat16 doubled(__nv_bfloat16 v) {
  return __float2bfloat16_rn(2.0f * __bfloat162float(v));
}

// The first 32-byte boundary at or after p: what a WMMA pointer into dynamic shared memory needs.
template <class T>
__device__ __forceinline__ T* align32(void* p) {
  return reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(p) + 31) & ~uintptr_t(31));
}

using Accumulator = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

template <class T, class LayoutA, class LayoutB>
__global__ void tile_product_kernel(const T* a, unsigned lda, const T* b, unsigned ldb, const float* c, unsigned ldc,
                                    wmma::layout_t c_layout, float* d, unsigned ldd, wmma::layout_t d_layout) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LayoutA> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LayoutB> fb;
  Accumulator acc;
  wmma::load_matrix_sync(fa, a, lda);
  wmma::load_matrix_sync(fb, b, ldb);
  wmma::load_matrix_sync(acc, c, ldc, c_layout);
  wmma::mma_sync(acc, fa, fb, acc);  // d is c: allowed
  wmma::store_matrix_sync(d, acc, ldd, d_layout);
}

template <class T, class LayoutA, class LayoutB>
void launch_tile_product(const void* a, unsigned lda, const void* b, unsigned ldb, const float* c, unsigned ldc,
                         bool c_col, float* d, unsigned ldd, bool d_col) {
  LT_LAUNCH(1, 32, 0, nullptr, tile_product_kernel<T, LayoutA, LayoutB>)
  (static_cast<const T*>(a), lda, static_cast<const T*>(b), ldb, c, ldc,
   c_col ? wmma::mem_col_major : wmma::mem_row_major, d, ldd, d_col ? wmma::mem_col_major : wmma::mem_row_major);
}

template <class T>
void launch_tile_product(bool a_col, bool b_col, const void* a, unsigned lda, const void* b, unsigned ldb,
                         const float* c, unsigned ldc, bool c_col, float* d, unsigned ldd, bool d_col) {
  if (!a_col && !b_col)
    launch_tile_product<T, wmma::row_major, wmma::row_major>(a, lda, b, ldb, c, ldc, c_col, d, ldd, d_col);
  if (!a_col && b_col)
    launch_tile_product<T, wmma::row_major, wmma::col_major>(a, lda, b, ldb, c, ldc, c_col, d, ldd, d_col);
  if (a_col && !b_col)
    launch_tile_product<T, wmma::col_major, wmma::row_major>(a, lda, b, ldb, c, ldc, c_col, d, ldd, d_col);
  if (a_col && b_col)
    launch_tile_product<T, wmma::col_major, wmma::col_major>(a, lda, b, ldb, c, ldc, c_col, d, ldd, d_col);
}

// A warp per 16×16 tile of d; a and b row-major. Through shared memory: the block copies a and b
// there (rows padded by 8 elements, a leading dimension that is not the width), each warp stores
// its tile there and copies it out after a __syncwarp.
template <class T>
__global__ void gemm_kernel(const T* a, const T* b, const float* c, float* d, int m, int n, int k, bool shared) {
  LT_DYNAMIC_SHARED(unsigned char, raw);
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const int tiles_n = n / 16, row = warp / tiles_n * 16, col = warp % tiles_n * 16;
  const unsigned lda = shared ? unsigned(k + 8) : unsigned(k), ldb = shared ? unsigned(n + 8) : unsigned(n);
  const T* sa = a;
  const T* sb = b;
  float* sd = nullptr;
  if (shared) {
    T* ta = align32<T>(raw);
    T* tb = ta + m * int(lda);
    sd = reinterpret_cast<float*>(tb + k * int(ldb));
    for (int i = int(threadIdx.x); i < m * k; i += int(blockDim.x)) ta[i / k * int(lda) + i % k] = a[i];
    for (int i = int(threadIdx.x); i < k * n; i += int(blockDim.x)) tb[i / n * int(ldb) + i % n] = b[i];
    __syncthreads();
    sa = ta;
    sb = tb;
  }
  Accumulator acc;
  wmma::load_matrix_sync(acc, c + row * n + col, unsigned(n), wmma::mem_row_major);
  for (int kk = 0; kk < k; kk += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
    wmma::load_matrix_sync(fa, sa + row * int(lda) + kk, lda);
    wmma::load_matrix_sync(fb, sb + kk * int(ldb) + col, ldb);
    wmma::mma_sync(acc, fa, fb, acc);
  }
  if (!shared) {
    wmma::store_matrix_sync(d + row * n + col, acc, unsigned(n), wmma::mem_row_major);
    return;
  }
  float* tile = sd + warp * 16 * 16;
  wmma::store_matrix_sync(tile, acc, 16, wmma::mem_col_major);
  __syncwarp();
  for (int i = lane; i < 256; i += 32) d[(row + i % 16) * n + col + i / 16] = tile[i];
}

__global__ void elementwise_kernel(const __nv_bfloat16* a, const __nv_bfloat16* b, const float* m, float* filled,
                                   float* affine, float* scaled) {
  Accumulator acc;
  wmma::fill_fragment(acc, 3.0f);
  wmma::store_matrix_sync(filled, acc, 16, wmma::mem_row_major);
  wmma::load_matrix_sync(acc, m, 16, wmma::mem_row_major);
  for (int i = 0; i < acc.num_elements; ++i) acc.x[i] = 2.0f * acc.x[i] + 1.0f;
  wmma::store_matrix_sync(affine, acc, 16, wmma::mem_row_major);
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  for (int i = 0; i < fa.num_elements; ++i) fa.x[i] = doubled(fa.x[i]);
  wmma::fill_fragment(acc, 0.0f);
  wmma::mma_sync(acc, fa, fb, acc);
  wmma::store_matrix_sync(scaled, acc, 16, wmma::mem_row_major);
}

__global__ void holders_kernel(float* acc_slot, float* a_element, float* b_element, int* num_elements) {
  __shared__ __align__(32) __half index[256];
  const int lane = int(threadIdx.x);
  for (int i = lane; i < 256; i += 32) index[i] = __float2half_rn(float(i));
  __syncwarp();
  Accumulator acc;
  for (int i = 0; i < acc.num_elements; ++i) acc.x[i] = float(lane * acc.num_elements + i);
  wmma::store_matrix_sync(acc_slot, acc, 16, wmma::mem_row_major);
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb;
  wmma::load_matrix_sync(fa, index, 16);
  wmma::load_matrix_sync(fb, index, 16);
  for (int i = 0; i < fa.num_elements; ++i) a_element[lane * fa.num_elements + i] = __half2float(fa.x[i]);
  for (int i = 0; i < fb.num_elements; ++i) b_element[lane * fb.num_elements + i] = __half2float(fb.x[i]);
  if (lane == 0) *num_elements = fa.num_elements;
}

__global__ void scale_rows_assuming_layout_kernel(const float* m, float* out) {
  Accumulator acc;
  wmma::load_matrix_sync(acc, m, 16, wmma::mem_row_major);
  // planted bug: "lane L holds row L / 2" is a layout CUDA does not promise
  const float row = float(threadIdx.x / 2);
  for (int i = 0; i < acc.num_elements; ++i) acc.x[i] *= row + 1.0f;
  wmma::store_matrix_sync(out, acc, 16, wmma::mem_row_major);
}

// Each lane writes 8 elements of a tile in shared memory, the warp loads it as an accumulator and
// stores it back to shared memory, and each lane copies its 8 elements out. missing_sync 1 leaves
// out the __syncwarp before the load, 2 the one after the store (planted bugs).
__global__ void shared_round_trip_kernel(const float* m, float* out, int missing_sync) {
  LT_DYNAMIC_SHARED(unsigned char, raw);
  float* tile = align32<float>(raw);
  float* back = tile + 256;
  const int lane = int(threadIdx.x);
  for (int i = lane * 8; i < lane * 8 + 8; ++i) tile[i] = m[i];
  if (missing_sync != 1) __syncwarp();
  Accumulator acc;
  wmma::load_matrix_sync(acc, tile, 16, wmma::mem_row_major);
  wmma::store_matrix_sync(back, acc, 16, wmma::mem_row_major);
  if (missing_sync != 2) __syncwarp();
  for (int i = lane * 8; i < lane * 8 + 8; ++i) out[i] = back[i];
}

__global__ void lane_returns_kernel(int call, int leaving) {
  __shared__ __align__(32) __nv_bfloat16 tile[256];
  const int lane = int(threadIdx.x);
  for (int i = lane; i < 256; i += 32) tile[i] = __float2bfloat16_rn(1.0f);
  __syncwarp();
  if (call == 1 && lane == leaving) return;  // planted bug: the warp's load misses this lane
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
  wmma::load_matrix_sync(fa, tile, 16);
  wmma::load_matrix_sync(fb, tile, 16);
  Accumulator acc;
  wmma::fill_fragment(acc, 0.0f);
  if (call == 0 && lane == leaving) return;  // planted bug: the warp's mma misses this lane
  wmma::mma_sync(acc, fa, fb, acc);
}

__global__ void lanes_disagree_kernel(int what) {
  __shared__ __align__(32) __nv_bfloat16 tile[16 * 32];
  const int lane = int(threadIdx.x);
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  const unsigned ldm = what == 0 && lane == 7 ? 24u : 16u;            // planted bug: lane 7's ldm
  const __nv_bfloat16* p = tile + (what == 1 && lane == 3 ? 16 : 0);  // planted bug: lane 3's mptr
  wmma::load_matrix_sync(fa, p, ldm);
}

__global__ void bad_memory_kernel(int what) {
  LT_DYNAMIC_SHARED(unsigned char, raw);
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  if (what == 0) wmma::load_matrix_sync(fa, reinterpret_cast<const __nv_bfloat16*>(raw), 16);  // not rounded up
  if (what == 1) wmma::load_matrix_sync(fa, align32<const __nv_bfloat16>(raw), 12);
  Accumulator acc;
  wmma::fill_fragment(acc, 0.0f);
  if (what == 2) wmma::store_matrix_sync(align32<float>(raw), acc, 6, wmma::mem_row_major);
}

__global__ void partial_warp_kernel() {
  __shared__ __align__(32) __nv_bfloat16 tile[256];
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  wmma::load_matrix_sync(fa, tile, 16);
}

__global__ void lanes_wait_elsewhere_kernel() {
  __shared__ __align__(32) __nv_bfloat16 tile[256];
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
  if (threadIdx.x < 16) {
    __syncthreads();  // planted bug: half the warp waits here, the other half at the load
  } else {
    wmma::load_matrix_sync(fa, tile, 16);
  }
}

// Variant 0 is never opted in; variant 1 is, by shared_with_opt_in.
template <int Variant>
__global__ void big_shared_kernel(float* out, int floats) {
  LT_DYNAMIC_SHARED(float, buf);
  const int t = int(threadIdx.x);
  for (int i = t; i < floats; i += int(blockDim.x)) buf[i] = float(i);
  __syncthreads();
  out[t] = buf[floats - 1 - t] - float(floats - 1 - 2 * t);  // = t
}

}  // namespace

cudaError_t wmma_tile_product(WmmaInput input, bool a_col, bool b_col, bool c_col, bool d_col, const void* a,
                              unsigned lda, const void* b, unsigned ldb, const float* c, unsigned ldc, float* d,
                              unsigned ldd) {
  if (input == WmmaInput::bf16)
    launch_tile_product<__nv_bfloat16>(a_col, b_col, a, lda, b, ldb, c, ldc, c_col, d, ldd, d_col);
  else
    launch_tile_product<__half>(a_col, b_col, a, lda, b, ldb, c, ldc, c_col, d, ldd, d_col);
  return cudaGetLastError();
}

cudaError_t wmma_gemm(WmmaInput input, bool through_shared, const void* a, const void* b, const float* c, float* d,
                      int m, int n, int k) {
  const int warps = m / 16 * (n / 16);
  // a and b of 2-byte elements with padded rows, d's tiles, and the 32-byte round-up.
  const size_t smem = through_shared ? size_t(m * (k + 8) + k * (n + 8)) * 2 + size_t(warps) * 256 * 4 + 32 : 0;
  if (input == WmmaInput::bf16) {
    LT_LAUNCH(1, warps * 32, smem, nullptr, gemm_kernel<__nv_bfloat16>)
    (static_cast<const __nv_bfloat16*>(a), static_cast<const __nv_bfloat16*>(b), c, d, m, n, k, through_shared);
  } else {
    LT_LAUNCH(1, warps * 32, smem, nullptr, gemm_kernel<__half>)
    (static_cast<const __half*>(a), static_cast<const __half*>(b), c, d, m, n, k, through_shared);
  }
  return cudaGetLastError();
}

cudaError_t wmma_elementwise(const void* a, const void* b, const float* m, float* filled, float* affine,
                             float* scaled) {
  LT_LAUNCH(1, 32, 0, nullptr, elementwise_kernel)
  (static_cast<const __nv_bfloat16*>(a), static_cast<const __nv_bfloat16*>(b), m, filled, affine, scaled);
  return cudaGetLastError();
}

cudaError_t wmma_holders(float* acc_slot, float* a_element, float* b_element, int* num_elements) {
  LT_LAUNCH(1, 32, 0, nullptr, holders_kernel)(acc_slot, a_element, b_element, num_elements);
  return cudaGetLastError();
}

cudaError_t wmma_scale_rows_assuming_layout(const float* m, float* out) {
  LT_LAUNCH(1, 32, 0, nullptr, scale_rows_assuming_layout_kernel)(m, out);
  return cudaGetLastError();
}

cudaError_t wmma_shared_round_trip(const float* m, float* out, int missing_sync) {
  LT_LAUNCH(1, 32, 2 * 256 * 4 + 32, nullptr, shared_round_trip_kernel)(m, out, missing_sync);
  return cudaGetLastError();
}

cudaError_t wmma_lane_returns_before(int call, int lane) {
  LT_LAUNCH(1, 32, 0, nullptr, lane_returns_kernel)(call, lane);
  return cudaGetLastError();
}

cudaError_t wmma_lanes_disagree(int what) {
  LT_LAUNCH(1, 32, 0, nullptr, lanes_disagree_kernel)(what);
  return cudaGetLastError();
}

cudaError_t wmma_bad_memory(int what) {
  LT_LAUNCH(1, 32, 16 * 16 * 4 + 32, nullptr, bad_memory_kernel)(what);
  return cudaGetLastError();
}

cudaError_t wmma_partial_warp() {
  LT_LAUNCH(1, 16, 0, nullptr, partial_warp_kernel)();
  return cudaGetLastError();
}

cudaError_t wmma_lanes_wait_elsewhere() {
  LT_LAUNCH(1, 32, 0, nullptr, lanes_wait_elsewhere_kernel)();
  return cudaGetLastError();
}

cudaError_t shared_without_opt_in(size_t bytes, float* out) {
  LT_LAUNCH(1, 256, bytes, nullptr, big_shared_kernel<0>)(out, int(bytes / sizeof(float)));
  return cudaGetLastError();
}

cudaError_t shared_with_opt_in(int attribute, size_t bytes, float* out) {
  const cudaError_t e =
      cudaFuncSetAttribute(big_shared_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, attribute);
  if (e != cudaSuccess) return e;
  LT_LAUNCH(1, 256, bytes, nullptr, big_shared_kernel<1>)(out, int(bytes / sizeof(float)));
  return cudaGetLastError();
}

}  // namespace llmtrain::cuda_sim_test
