// The linear layer on the device (kernels/cpu/linear.cpp is the reference; kernels/op_table.def has
// the contract): cuBLASLt takes the products on a GPU (kernels/cuda/cublaslt.h, docs/cuda.md); our
// tiled GEMM here is the fallback and what the simulator runs.
//
// The kernel: C[M, N] = (accumulate ? C : 0) + op(A)·op(B) (+ bias[N]), fp32 arithmetic whatever the
// storage, one rounding per stored element. A block of 16×16 threads owns a 64×64 tile of C, each
// thread a 4×4 grid of it (rows ty + 16i, columns tx + 16j); K advances 16 at a time through shared
// memory.
//
// The rule a reader could get wrong: both __syncthreads in the K loop are needed: the first so that
// the tile is loaded before anyone reads it, the second so that nobody loads the next tile while a
// slower thread still reads this one.
#include "kernels/cuda/storage.cuh"
#if LLMTRAIN_CUBLASLT
#include "kernels/cuda/cublaslt.h"
#endif

namespace llmtrain::kernels::cuda {
namespace {

constexpr int kTile = 64, kTileK = 16, kSide = 16, kPer = kTile / kSide;

template <class T>
__global__ void gemm_kernel(T* c, const T* __restrict__ a, const T* __restrict__ b, const T* __restrict__ bias,
                            int64_t m_size, int64_t n_size, int64_t k_size, int64_t lda, int64_t ldb, int64_t ldc,
                            bool trans_a, bool trans_b, bool accumulate) {
  __shared__ float as[kTileK][kTile + 1];  // as[k][m]
  __shared__ float bs[kTileK][kTile + 1];  // bs[k][n]
  const int tx = int(threadIdx.x), ty = int(threadIdx.y), tid = ty * kSide + tx;
  const int64_t m0 = int64_t(blockIdx.y) * kTile, n0 = int64_t(blockIdx.x) * kTile;
  float acc[kPer][kPer];
  for (int i = 0; i < kPer; ++i)
    for (int j = 0; j < kPer; ++j) acc[i][j] = 0.0f;
  for (int64_t k0 = 0; k0 < k_size; k0 += kTileK) {
    for (int e = tid; e < kTileK * kTile; e += kSide * kSide) {
      // Transposed operands load along their contiguous dimension (k runs fastest otherwise).
      const int kk = trans_a ? e / kTile : e % kTileK, mm = trans_a ? e % kTile : e / kTileK;
      const int64_t m = m0 + mm, k = k0 + kk;
      as[kk][mm] = m < m_size && k < k_size ? load(a, trans_a ? k * lda + m : m * lda + k) : 0.0f;
      const int kb = trans_b ? e % kTileK : e / kTile, nn = trans_b ? e / kTileK : e % kTile;
      const int64_t n = n0 + nn, kn = k0 + kb;
      bs[kb][nn] = n < n_size && kn < k_size ? load(b, trans_b ? n * ldb + kn : kn * ldb + n) : 0.0f;
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
  for (int i = 0; i < kPer; ++i) {
    const int64_t m = m0 + ty + kSide * i;
    if (m >= m_size) continue;
    for (int j = 0; j < kPer; ++j) {
      const int64_t n = n0 + tx + kSide * j;
      if (n >= n_size) continue;
      float v = acc[i][j];
      if (bias != nullptr) v += load(bias, n);
      if (accumulate) v += load(c, m * ldc + n);
      store(c, m * ldc + n, v);
    }
  }
}

template <class T>
void gemm(T* c, const T* a, const T* b, const T* bias, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
          bool trans_a, bool trans_b, bool accumulate) {
  if (m == 0 || n == 0) return;
  const dim3 grid(unsigned((n + kTile - 1) / kTile), unsigned((m + kTile - 1) / kTile));
  LT_LAUNCH(grid, dim3(kSide, kSide), 0, compute_stream(), gemm_kernel<T>)
  (c, a, b, bias, m, n, k, lda, ldb, n, trans_a, trans_b, accumulate);
}

}  // namespace

// The linear layer's three products. Row-major X[r, c] is column-major Xᵀ, so each goes to cuBLASLt
// transposed: out = in·Wᵀ is outᵀ[o, n] = W[o, i]·inᵀ[i, n]; din = dout·W is dinᵀ[i, n] =
// Wᵀ[i, o]·doutᵀ[o, n]; dW += doutᵀ·in is dWᵀ[i, o] += inᵀ[i, n]·dout[n, o]. Our tiled GEMM takes
// a product cuBLASLt does not (the simulator, LLMTRAIN_CUDA_GEMM=tiled, no algorithm).
void linear_forward(Tensor out, Tensor in, Tensor weight, Tensor bias) {
  const int64_t o = weight.shape[0], i = weight.shape[1], n = i ? in.numel() / i : 0;
#if LLMTRAIN_CUBLASLT
  if (gemm_uses_cublaslt() &&
      cublaslt_matmul(storage_of(out), out.data, weight.data, in.data, bias.data, o, n, i, i, i, o, true, false, false))
    return;
#endif
  with_storage(out, [&](auto tag) {
    using T = decltype(tag);
    // out [n, o] = in [n, i] · weight [o, i]ᵀ
    gemm(data<T>(out), data<const T>(in), data<const T>(weight), data<const T>(bias), n, o, i, i, i, false, true,
         false);
  });
  LT_CUDA_LAUNCHED("gemm_kernel (linear_forward)");
}

void linear_backward_input(Tensor din, Tensor dout, Tensor weight) {
  const int64_t o = weight.shape[0], i = weight.shape[1], n = o ? dout.numel() / o : 0;
#if LLMTRAIN_CUBLASLT
  if (gemm_uses_cublaslt() && cublaslt_matmul(storage_of(din), din.data, weight.data, dout.data, nullptr, i, n, o, i, o,
                                              i, false, false, false))
    return;
#endif
  with_storage(din, [&](auto tag) {
    using T = decltype(tag);
    // din [n, i] = dout [n, o] · weight [o, i]
    gemm(data<T>(din), data<const T>(dout), data<const T>(weight), static_cast<const T*>(nullptr), n, i, o, o, i, false,
         false, false);
  });
  LT_CUDA_LAUNCHED("gemm_kernel (linear_backward_input)");
}

void linear_backward(Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in, Tensor weight) {
  const int64_t o = weight.shape[0], i = weight.shape[1], n = o ? dout.numel() / o : 0;
  if (din.defined()) cuda::linear_backward_input(din, dout, weight);
  bool done = false;
#if LLMTRAIN_CUBLASLT
  done = gemm_uses_cublaslt() && cublaslt_matmul(storage_of(dweight), dweight.data, in.data, dout.data, nullptr, i, o,
                                                 n, i, o, i, false, true, true);
#endif
  if (!done) {
    with_storage(dweight, [&](auto tag) {
      using T = decltype(tag);
      // dweight [o, i] += doutᵀ [o, n] · in [n, i]
      gemm(data<T>(dweight), data<const T>(dout), data<const T>(in), static_cast<const T*>(nullptr), o, i, n, o, i,
           true, false, true);
    });
    LT_CUDA_LAUNCHED("gemm_kernel (linear_backward weight)");
  }
  if (dbias.defined()) cuda::residual_backward(dbias, dout);  // the bias gradient: dout's column sums
}

}  // namespace llmtrain::kernels::cuda
