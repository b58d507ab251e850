// The linear layer on the device (kernels/cpu/linear.cpp is the reference; kernels/op_table.def has
// the contract): cuBLASLt takes the products on a GPU (kernels/cuda/cublaslt.h, docs/cuda.md); our
// tiled GEMM here is the fallback (LLMTRAIN_CUDA_GEMM=tiled, or a product cuBLASLt has no algorithm
// for); the simulator runs its model of cuBLASLt (kernels/cuda/sim/sim_cublaslt.cu).
//
// The kernel: C[M, N] = (accumulate ? C : 0) + op(A)·op(B) (+ bias[N]), fp32 arithmetic whatever the
// storage, one rounding per stored element: a block per 64×64 tile of C through the shared tiled
// GEMM (kernels/cuda/gemm_tile.cuh).
//
// cuBLASLt's epilogues take the passes next to a product (docs/cuda.md "Matrix products"): the MLP's
// GELU (forward, with fc as the aux output) and its gradient with the fc bias's, and every linear's
// bias gradient on the weight-gradient product. The rule a reader could get wrong: an epilogue's bias
// gradient is WRITTEN, our bias gradients ACCUMULATE (micro-batches add up), so the epilogue writes
// into device scratch and a pass over the bias adds it. Where cuBLASLt takes no epilogue (an aux
// leading dimension not a multiple of 8, no algorithm) the unfused kernels run: the same results up
// to rounding.
#include "kernels/cuda/gemm_tile.cuh"
#include "kernels/op_profile.h"
#if LLMTRAIN_CUBLASLT
#include "kernels/cuda/cublaslt.h"
#endif

namespace llmtrain::kernels::cuda {
namespace {

using gemm::kPer;
using gemm::kSide;
using gemm::kTile;

template <class T>
__global__ void gemm_kernel(T* c, const T* __restrict__ a, const T* __restrict__ b, const T* __restrict__ bias,
                            int64_t m_size, int64_t n_size, int64_t k_size, int64_t lda, int64_t ldb, int64_t ldc,
                            bool trans_a, bool trans_b, bool accumulate) {
  const int64_t m0 = int64_t(blockIdx.y) * kTile, n0 = int64_t(blockIdx.x) * kTile;
  float acc[kPer][kPer];
  gemm::gemm_zero(acc);
  // Row-major: A(m, k) = a[m·lda + k] (a[k·lda + m] transposed), B(k, n) = b[k·ldb + n] (b[n·ldb + k]).
  gemm::gemm_tile(acc, gemm::Operand<T>{a, trans_a ? 1 : lda, trans_a ? lda : 1, m_size}, m0,
                  gemm::Operand<T>{b, trans_b ? ldb : 1, trans_b ? 1 : ldb, n_size}, n0, 0, k_size);
  for (int i = 0; i < kPer; ++i) {
    const int64_t m = m0 + gemm::tile_row(i);
    if (m >= m_size) continue;
    for (int j = 0; j < kPer; ++j) {
      const int64_t n = n0 + gemm::tile_col(j);
      if (n >= n_size) continue;
      float v = acc[i][j];
      if (bias != nullptr) v += load(bias, n);
      if (accumulate) v += load(c, m * ldc + n);
      store(c, m * ldc + n, v);
    }
  }
}

template <class T>
void tiled_gemm(T* c, const T* a, const T* b, const T* bias, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                bool trans_a, bool trans_b, bool accumulate) {
  if (m == 0 || n == 0) return;
  ProfileScope scope("tiled GEMM");  // a row of its own inside the op's (log.profile: ops)
  const dim3 grid(unsigned((n + kTile - 1) / kTile), unsigned((m + kTile - 1) / kTile));
  LT_LAUNCH(grid, dim3(kSide, kSide), 0, compute_stream(), gemm_kernel<T>)
  (c, a, b, bias, m, n, k, lda, ldb, n, trans_a, trans_b, accumulate);
}

#if LLMTRAIN_CUBLASLT
// Where a bias-gradient epilogue writes: device scratch of dbias's dtype and shape (slot 0: no other
// user of it is live across a linear op), stream-ordered like the ops that read it.
Tensor bias_scratch(const Tensor& dbias) {
  return Tensor(device_scratch(0, size_t(dbias.bytes())), dbias.dtype, dbias.shape, Device::cuda);
}
#endif

}  // namespace

// The linear layer's three products. Row-major X[r, c] is column-major Xᵀ, so each goes to cuBLASLt
// transposed: out = in·Wᵀ is outᵀ[o, n] = W[o, i]·inᵀ[i, n]; din = dout·W is dinᵀ[i, n] =
// Wᵀ[i, o]·doutᵀ[o, n]; dW += doutᵀ·in is dWᵀ[i, o] += inᵀ[i, n]·dout[n, o]. Our tiled GEMM takes
// a product cuBLASLt does not (the simulator, LLMTRAIN_CUDA_GEMM=tiled, no algorithm).
void linear_forward(Tensor out, Tensor in, Tensor weight, Tensor bias) {
  const int64_t o = weight.shape[0], i = weight.shape[1], n = i ? in.numel() / i : 0;
#if LLMTRAIN_CUBLASLT
  Product p{storage_of(out), out.data, weight.data, in.data, o, n, i, i, i, o, true, false, false};
  if (bias.defined()) {
    p.epilogue = Epilogue::bias;
    p.bias = bias.data;
  }
  if (gemm_uses_cublaslt() && cublaslt_matmul(p)) return;
#endif
  with_storage(out, [&](auto tag) {
    using T = decltype(tag);
    // out [n, o] = in [n, i] · weight [o, i]ᵀ
    tiled_gemm(data<T>(out), data<const T>(in), data<const T>(weight), data<const T>(bias), n, o, i, i, i, false, true,
               false);
  });
  LT_CUDA_LAUNCHED("gemm_kernel (linear_forward)");
}

void linear_backward_input(Tensor din, Tensor dout, Tensor weight) {
  const int64_t o = weight.shape[0], i = weight.shape[1], n = o ? dout.numel() / o : 0;
#if LLMTRAIN_CUBLASLT
  if (gemm_uses_cublaslt() && cublaslt_matmul(Product{storage_of(din), din.data, weight.data, dout.data, i, n, o, i, o,
                                                      i, false, false, false}))
    return;
#endif
  with_storage(din, [&](auto tag) {
    using T = decltype(tag);
    // din [n, i] = dout [n, o] · weight [o, i]
    tiled_gemm(data<T>(din), data<const T>(dout), data<const T>(weight), static_cast<const T*>(nullptr), n, i, o, o, i,
               false, false, false);
  });
  LT_CUDA_LAUNCHED("gemm_kernel (linear_backward_input)");
}

void linear_backward(Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in, Tensor weight) {
  const int64_t o = weight.shape[0], i = weight.shape[1], n = o ? dout.numel() / o : 0;
  if (din.defined()) cuda::linear_backward_input(din, dout, weight);
  bool done = false, bias_done = false;
#if LLMTRAIN_CUBLASLT
  if (gemm_uses_cublaslt()) {
    Product p{storage_of(dweight), dweight.data, in.data, dout.data, i, o, n, i, o, i, false, true, true};
    if (dbias.defined()) {
      // BGRADB: dout's column sums (op(B)'s over k) from the same pass over dout as the product.
      const Tensor sums = bias_scratch(dbias);
      p.epilogue = Epilogue::bgradb;
      p.bias = sums.data;
      bias_done = done = cublaslt_matmul(p);
      if (bias_done) cuda::residual_forward(dbias, dbias, sums, Tensor{});  // accumulate what it wrote
      p.epilogue = Epilogue::none;
      p.bias = nullptr;
    }
    if (!done) done = cublaslt_matmul(p);
  }
#endif
  if (!done) {
    with_storage(dweight, [&](auto tag) {
      using T = decltype(tag);
      // dweight [o, i] += doutᵀ [o, n] · in [n, i]
      tiled_gemm(data<T>(dweight), data<const T>(dout), data<const T>(in), static_cast<const T*>(nullptr), o, i, n, o,
                 i, true, false, true);
    });
    LT_CUDA_LAUNCHED("gemm_kernel (linear_backward weight)");
  }
  if (dbias.defined() && !bias_done) cuda::residual_backward(dbias, dout);  // dout's column sums
}

// act = GELU(fc), fc = in·Wᵀ + b as one product: GELU_AUX_BIAS writes fc as the aux output (its
// leading dimension o must be a multiple of 8) and applies the GELU to the fp32 sum, saving
// gelu_forward's pass over fc (a read of fc and a write of act through memory).
void linear_gelu_forward(Tensor act, Tensor fc, Tensor in, Tensor weight, Tensor bias) {
#if LLMTRAIN_CUBLASLT
  const int64_t o = weight.shape[0], i = weight.shape[1], n = i ? in.numel() / i : 0;
  if (gemm_uses_cublaslt() && o % 8 == 0) {
    Product p{storage_of(act), act.data, weight.data, in.data, o, n, i, i, i, o, true, false, false};
    p.epilogue = bias.defined() ? Epilogue::gelu_aux_bias : Epilogue::gelu_aux;
    p.bias = bias.data;
    p.aux = fc.data;
    p.ldaux = o;
    if (cublaslt_matmul(p)) return;
  }
#endif
  cuda::linear_forward(fc, in, weight, bias);
  cuda::gelu_forward(act, fc);
}

// din = (dout·W) ⊙ GELU'(pre) as one product: DGELU (DGELU_BGRAD with the bias gradient, written
// into scratch and added) on the input-gradient product dinᵀ[i, n] = Wᵀ·doutᵀ, aux = pre with
// leading dimension i (a multiple of 8). It saves gelu_backward's pass (read dact and pre, write
// din) and the bias gradient's read of din.
void linear_backward_input_gelu(Tensor din, Tensor dbias, Tensor dout, Tensor weight, Tensor pre) {
#if LLMTRAIN_CUBLASLT
  const int64_t o = weight.shape[0], i = weight.shape[1], n = i ? din.numel() / i : 0;
  if (gemm_uses_cublaslt() && i % 8 == 0) {
    Product p{storage_of(din), din.data, weight.data, dout.data, i, n, o, i, o, i, false, false, false};
    p.epilogue = dbias.defined() ? Epilogue::dgelu_bgrad : Epilogue::dgelu;
    p.aux = pre.data;
    p.ldaux = i;
    const Tensor sums = dbias.defined() ? bias_scratch(dbias) : Tensor{};
    p.bias = sums.data;
    if (cublaslt_matmul(p)) {
      if (dbias.defined()) cuda::residual_forward(dbias, dbias, sums, Tensor{});  // accumulate what it wrote
      return;
    }
  }
#endif
  cuda::linear_backward_input(din, dout, weight);
  cuda::gelu_backward(din, din, pre);
  if (dbias.defined()) cuda::residual_backward(dbias, din);
}

}  // namespace llmtrain::kernels::cuda
