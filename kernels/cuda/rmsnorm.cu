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

void rmsnorm_forward_launch(Storage s, void* out, float* rstd, const void* in, const void* weight, int64_t n, int64_t c,
                            float eps) {
  if (n == 0) return;
  with_storage(s, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(unsigned((n + kRowsPerBlock - 1) / kRowsPerBlock), 32 * kRowsPerBlock, 0, nullptr,
              rmsnorm_forward_kernel<T>)
    (static_cast<T*>(out), rstd, static_cast<const T*>(in), static_cast<const T*>(weight), n, c, eps);
  });
}

void rmsnorm_backward_launch(Storage s, void* din, void* dweight, const void* dout, const void* in, const void* weight,
                             const float* rstd, const void* dresidual, int64_t n, int64_t c) {
  if (n == 0) return;
  with_storage(s, [&](auto tag) {
    using T = decltype(tag);
    column_sums<1>(RmsnormWeightTerm<T>{static_cast<const T*>(dout), static_cast<const T*>(in), rstd, c},
                   AddToColumn<T>{static_cast<T*>(dweight)}, n, c);
    LT_LAUNCH(unsigned((n + kRowsPerBlock - 1) / kRowsPerBlock), 32 * kRowsPerBlock, 0, nullptr,
              rmsnorm_backward_kernel<T>)
    (static_cast<T*>(din), static_cast<const T*>(dout), static_cast<const T*>(in), static_cast<const T*>(weight), rstd,
     static_cast<const T*>(dresidual), n, c);
  });
}

}  // namespace llmtrain::kernels::cuda
