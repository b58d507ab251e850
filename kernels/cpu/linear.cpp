// Linear layers through OpenBLAS sgemm (row-major, weight [out, in] as nn.Linear):
//   forward   out  = in · Wᵀ            sgemm(N, T)  M=N_rows  N=out  K=in
//   backward  din  = dout · W           sgemm(N, N)  M=N_rows  N=in   K=out
//             dW  += doutᵀ · in         sgemm(T, N)  M=out     N=in   K=N_rows, beta = 1
// Rule a reader could get wrong: called outside any OpenMP region, sgemm uses all the BLAS
// threads (OpenBLAS's OpenMP build shares our pool); called inside one (attention) it runs on the
// calling thread. Never link the pthread OpenBLAS: its threads would fight ours.
#include <cblas.h>

#include <algorithm>
#include <limits>

#include "common/error.h"
#include "kernels/cpu/column_sum.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/stored.h"

namespace llmtrain::kernels::cpu {

namespace {
int blas_int(int64_t v) {
  LT_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(), "matrix dimension {} exceeds BLAS's int", v);
  return int(v);
}
}  // namespace

void linear_forward(Tensor out, Tensor in, Tensor weight, Tensor bias) {
  const int64_t k = in.shape[in.shape.rank() - 1], n = in.numel() / k, o = weight.numel() / k;
  float* y = out.ptr<float>();
  float beta = 0.0f;
  if (bias.defined()) {
    const float* b = bias.ptr<float>();
#pragma omp parallel for schedule(static) if (n * o > 32768)
    for (int64_t i = 0; i < n; ++i) std::copy(b, b + o, y + i * o);
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blas_int(n), blas_int(o), blas_int(k), 1.0f, in.ptr<float>(),
              blas_int(k), weight.ptr<float>(), blas_int(k), beta, y, blas_int(o));
}

void linear_backward(Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in, Tensor weight) {
  const int64_t k = in.shape[in.shape.rank() - 1], n = in.numel() / k, o = weight.numel() / k;
  const float* dy = dout.ptr<float>();
  if (din.defined())
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_int(n), blas_int(k), blas_int(o), 1.0f, dy, blas_int(o),
                weight.ptr<float>(), blas_int(k), 0.0f, din.ptr<float>(), blas_int(k));
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, blas_int(o), blas_int(k), blas_int(n), 1.0f, dy, blas_int(o),
              in.ptr<float>(), blas_int(k), 1.0f, dweight.ptr<float>(), blas_int(k));
  if (dbias.defined()) column_sum_add(dbias.ptr<float>(), dy, n, o);
}

// The same product as linear_backward's din, so a split backward's input gradient is bitwise the
// unsplit one's.
void linear_backward_input(Tensor din, Tensor dout, Tensor weight) {
  const int64_t k = din.shape[din.shape.rank() - 1], n = din.numel() / k, o = weight.numel() / k;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_int(n), blas_int(k), blas_int(o), 1.0f, dout.ptr<float>(),
              blas_int(o), weight.ptr<float>(), blas_int(k), 0.0f, din.ptr<float>(), blas_int(k));
}

// linear_forward then gelu_forward, fc rounded as stored in between: bitwise the two ops.
void linear_gelu_forward(Tensor act, Tensor fc, Tensor in, Tensor weight, Tensor bias) {
  cpu::linear_forward(fc, in, weight, bias);
  round_as_stored(fc);
  cpu::gelu_forward(act, fc);
}

// linear_backward_input, gelu_backward (in place) and residual_backward's column sums, each result
// rounded as stored: bitwise the three ops.
void linear_backward_input_gelu(Tensor din, Tensor dbias, Tensor dout, Tensor weight, Tensor pre) {
  cpu::linear_backward_input(din, dout, weight);
  round_as_stored(din);
  cpu::gelu_backward(din, din, pre);
  if (!dbias.defined()) return;
  round_as_stored(din);
  const int64_t c = din.shape[din.shape.rank() - 1];
  column_sum_add(dbias.ptr<float>(), din.ptr<float>(), c ? din.numel() / c : 0, c);
}

}  // namespace llmtrain::kernels::cpu
