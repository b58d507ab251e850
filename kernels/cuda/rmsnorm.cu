// RMSNorm on the device (kernels/cpu/rmsnorm.cpp is the reference), laid out as layernorm.cu: a
// warp per row (per head vector for head_rmsnorm_*), column_sums.cuh for the weight gradient.
//
// The rule a reader could get wrong: din may alias dresidual, and head_rmsnorm_backward's din may
// alias dout: an element is read and then written by one thread, the weight gradient's column sums
// run before, and the warp's sum over the head vector is complete before any of it is written.
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

// The head vectors [first_head, first_head + count) of every row of a [..., W, D] tensor, numbered
// k = n·count + (j − first_head) (rstd's order); at(k) is the offset of vector k's first value.
struct HeadVectors {
  int64_t width, d, first_head, count;
  __device__ int64_t at(int64_t k) const { return (k / count * width + first_head + k % count) * d; }
};

template <class T>
__global__ void head_rmsnorm_forward_kernel(T* __restrict__ out, float* __restrict__ rstd, const T* __restrict__ in,
                                            const T* __restrict__ weight, HeadVectors hv, int64_t n, float eps) {
  const int64_t k = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = int(threadIdx.x % 32);
  if (k >= n) return;
  const int64_t c = hv.d, at = hv.at(k);
  const T* x = in + at;
  float ss = 0.0f;
  for (int64_t j = lane; j < c; j += 32) ss += load(x, j) * load(x, j);
  const float r = 1.0f / sqrtf(warp_sum(ss) / float(c) + eps);
  for (int64_t j = lane; j < c; j += 32) store(out, at + j, load(x, j) * r * load(weight, j));
  if (lane == 0) rstd[k] = r;
}

// din and dout may be one tensor (no __restrict__ on them).
template <class T>
__global__ void head_rmsnorm_backward_kernel(T* din, const T* dout, const T* __restrict__ in,
                                             const T* __restrict__ weight, const float* __restrict__ rstd,
                                             HeadVectors hv, int64_t n) {
  const int64_t k = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = int(threadIdx.x % 32);
  if (k >= n) return;
  const int64_t c = hv.d, at = hv.at(k);
  const T *x = in + at, *dy = dout + at;
  const float r = rstd[k];
  float s = 0.0f;  // Σ dnorm·xhat
  for (int64_t j = lane; j < c; j += 32) s += load(dy, j) * load(weight, j) * load(x, j) * r;
  s = warp_sum(s) / float(c);
  for (int64_t j = lane; j < c; j += 32) store(din, at + j, r * (load(dy, j) * load(weight, j) - load(x, j) * r * s));
}

// The weight gradient's term of head vector k, column j.
template <class T>
struct HeadRmsnormWeightTerm {
  const T *dout, *in;
  const float* rstd;
  HeadVectors hv;
  __device__ void operator()(int64_t k, int64_t j, float* v) const {
    const int64_t at = hv.at(k) + j;
    v[0] = load(dout, at) * load(in, at) * rstd[k];
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

void head_rmsnorm_forward(Tensor out, Tensor rstd, Tensor in, Tensor weight, int64_t first_head, int64_t count,
                          float eps) {
  const HeadVectors hv{in.shape[in.shape.rank() - 2], weight.numel(), first_head, count};
  const int64_t n = hv.d ? in.numel() / (hv.width * hv.d) * count : 0;
  if (n == 0) return;
  with_storage(out, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_of(n, kRowsPerBlock), 32 * kRowsPerBlock, 0, compute_stream(), head_rmsnorm_forward_kernel<T>)
    (data<T>(out), rstd.ptr<float>(), data<const T>(in), data<const T>(weight), hv, n, eps);
  });
  LT_CUDA_LAUNCHED("head_rmsnorm_forward_kernel");
}

void head_rmsnorm_backward(Tensor din, Tensor dweight, Tensor dout, Tensor in, Tensor weight, Tensor rstd,
                           int64_t first_head, int64_t count) {
  const HeadVectors hv{in.shape[in.shape.rank() - 2], weight.numel(), first_head, count};
  const int64_t n = hv.d ? in.numel() / (hv.width * hv.d) * count : 0;
  if (n == 0) return;
  with_storage(din, [&](auto tag) {
    using T = decltype(tag);
    // Before din is written: din may be dout.
    column_sums<1>(HeadRmsnormWeightTerm<T>{data<const T>(dout), data<const T>(in), rstd.ptr<float>(), hv},
                   AddToColumn<T>{data<T>(dweight)}, n, hv.d);
    LT_CUDA_LAUNCHED("column_sums_kernel (head_rmsnorm_backward)");
    LT_LAUNCH(blocks_of(n, kRowsPerBlock), 32 * kRowsPerBlock, 0, compute_stream(), head_rmsnorm_backward_kernel<T>)
    (data<T>(din), data<const T>(dout), data<const T>(in), data<const T>(weight), rstd.ptr<float>(), hv, n);
  });
  LT_CUDA_LAUNCHED("head_rmsnorm_backward_kernel");
}

}  // namespace llmtrain::kernels::cuda
