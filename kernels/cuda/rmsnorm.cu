// RMSNorm on the device (kernels/cpu/rmsnorm.cpp is the reference), laid out as layernorm.cu: a
// warp per row, column_sums.cuh for the weight gradient.
//
// The rule a reader could get wrong: din may alias dresidual (read and written by one thread).
#include "kernels/cuda/column_sums.cuh"

namespace llmtrain::kernels::cuda {
namespace {

constexpr int kRowsPerBlock = 4;

template <class T>
__global__ void rmsnorm_forward_kernel(T* __restrict__ out, float* __restrict__ rstd, const T* __restrict__ in,
                                       const T* __restrict__ weight, int64_t n, int64_t c, float eps) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = int(threadIdx.x % 32);
  if (row >= n) return;
  const T* x = in + row * c;
  float ss = 0.0f;
  for (int64_t j = lane; j < c; j += 32) ss += load(x, j) * load(x, j);
  const float r = 1.0f / sqrtf(warp_sum(ss) / float(c) + eps);
  for (int64_t j = lane; j < c; j += 32) store(out, row * c + j, load(x, j) * r * load(weight, j));
  if (lane == 0) rstd[row] = r;
}

template <class T>
__global__ void rmsnorm_backward_kernel(T* din, const T* __restrict__ dout, const T* __restrict__ in,
                                        const T* __restrict__ weight, const float* __restrict__ rstd,
                                        const T* dresidual, int64_t n, int64_t c) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = int(threadIdx.x % 32);
  if (row >= n) return;
  const T *x = in + row * c, *dy = dout + row * c;
  const float r = rstd[row];
  float s = 0.0f;  // Σ dnorm·xhat
  for (int64_t j = lane; j < c; j += 32) s += load(dy, j) * load(weight, j) * load(x, j) * r;
  s = warp_sum(s) / float(c);
  for (int64_t j = lane; j < c; j += 32) {
    const float g = r * (load(dy, j) * load(weight, j) - load(x, j) * r * s);
    store(din, row * c + j, dresidual != nullptr ? load(dresidual, row * c + j) + g : g);
  }
}

// The weight gradient's term of row r, column j.
template <class T>
struct RmsnormWeightTerm {
  const T *dout, *in;
  const float* rstd;
  int64_t c;
  __device__ void operator()(int64_t r, int64_t j, float* v) const {
    v[0] = load(dout, r * c + j) * load(in, r * c + j) * rstd[r];
  }
};

}  // namespace

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor in, Tensor weight, float eps) {
  const int64_t c = weight.numel(), n = c ? in.numel() / c : 0;
  if (n == 0) return;
  with_storage(out, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_of(n, kRowsPerBlock), 32 * kRowsPerBlock, 0, compute_stream(), rmsnorm_forward_kernel<T>)
    (data<T>(out), rstd.ptr<float>(), data<const T>(in), data<const T>(weight), n, c, eps);
  });
  LT_CUDA_LAUNCHED("rmsnorm_forward_kernel");
}

void rmsnorm_backward(Tensor din, Tensor dweight, Tensor dout, Tensor in, Tensor weight, Tensor rstd,
                      Tensor dresidual) {
  const int64_t c = weight.numel(), n = c ? in.numel() / c : 0;
  if (n == 0) return;
  with_storage(din, [&](auto tag) {
    using T = decltype(tag);
    column_sums<1>(RmsnormWeightTerm<T>{data<const T>(dout), data<const T>(in), rstd.ptr<float>(), c},
                   AddToColumn<T>{data<T>(dweight)}, n, c);
    LT_CUDA_LAUNCHED("column_sums_kernel (rmsnorm_backward)");
    LT_LAUNCH(blocks_of(n, kRowsPerBlock), 32 * kRowsPerBlock, 0, compute_stream(), rmsnorm_backward_kernel<T>)
    (data<T>(din), data<const T>(dout), data<const T>(in), data<const T>(weight), rstd.ptr<float>(),
     data<const T>(dresidual), n, c);
  });
  LT_CUDA_LAUNCHED("rmsnorm_backward_kernel");
}

}  // namespace llmtrain::kernels::cuda
