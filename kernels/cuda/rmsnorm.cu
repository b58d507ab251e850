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

// The vectors one call normalizes: for whole rows {1, C, 0, 1}; for heads, [first_head, first_head +
// count) of every row of a [..., W, D] tensor, numbered k = n·count + (j − first_head) (rstd's
// order). at(k) is the offset of vector k's first value.
struct Vectors {
  int64_t width, d, first_head, count;
  int64_t total(int64_t numel) const { return d ? numel / (width * d) * count : 0; }
  __device__ int64_t at(int64_t k) const { return (k / count * width + first_head + k % count) * d; }
};

// A warp per vector.
template <class T>
__global__ void rmsnorm_forward_kernel(T* __restrict__ out, float* __restrict__ rstd, const T* __restrict__ in,
                                       const T* __restrict__ weight, Vectors v, int64_t n, float eps) {
  const int64_t k = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = int(threadIdx.x % 32);
  if (k >= n) return;
  const int64_t c = v.d, at = v.at(k);
  const T* x = in + at;
  float ss = 0.0f;
  for (int64_t j = lane; j < c; j += 32) ss += load(x, j) * load(x, j);
  const float r = 1.0f / sqrtf(warp_sum(ss) / float(c) + eps);
  for (int64_t j = lane; j < c; j += 32) store(out, at + j, load(x, j) * r * load(weight, j));
  if (lane == 0) rstd[k] = r;
}

// din may be dout or dresidual (no __restrict__ on them); dresidual (optional) is added to din.
template <class T>
__global__ void rmsnorm_backward_kernel(T* din, const T* dout, const T* __restrict__ in, const T* __restrict__ weight,
                                        const float* __restrict__ rstd, const T* dresidual, Vectors v, int64_t n) {
  const int64_t k = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = int(threadIdx.x % 32);
  if (k >= n) return;
  const int64_t c = v.d, at = v.at(k);
  const T *x = in + at, *dy = dout + at;
  const float r = rstd[k];
  float s = 0.0f;  // Σ dnorm·xhat
  for (int64_t j = lane; j < c; j += 32) s += load(dy, j) * load(weight, j) * load(x, j) * r;
  s = warp_sum(s) / float(c);
  for (int64_t j = lane; j < c; j += 32) {
    const float g = r * (load(dy, j) * load(weight, j) - load(x, j) * r * s);
    store(din, at + j, dresidual != nullptr ? load(dresidual, at + j) + g : g);
  }
}

// The weight gradient's term of vector k, column j.
template <class T>
struct RmsnormWeightTerm {
  const T *dout, *in;
  const float* rstd;
  Vectors v;
  __device__ void operator()(int64_t k, int64_t j, float* out) const {
    const int64_t at = v.at(k) + j;
    out[0] = load(dout, at) * load(in, at) * rstd[k];
  }
};

void rms_forward(Tensor out, Tensor rstd, Tensor in, Tensor weight, Vectors v, float eps) {
  const int64_t n = v.total(in.numel());
  if (n == 0) return;
  with_storage(out, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_of(n, kRowsPerBlock), 32 * kRowsPerBlock, 0, compute_stream(), rmsnorm_forward_kernel<T>)
    (data<T>(out), rstd.ptr<float>(), data<const T>(in), data<const T>(weight), v, n, eps);
  });
  LT_CUDA_LAUNCHED("rmsnorm_forward_kernel");
}

void rms_backward(Tensor din, Tensor dweight, Tensor dout, Tensor in, Tensor weight, Tensor rstd, Tensor dresidual,
                  Vectors v) {
  const int64_t n = v.total(in.numel());
  if (n == 0) return;
  with_storage(din, [&](auto tag) {
    using T = decltype(tag);
    // Before din is written: din may be dout.
    column_sums<1>(RmsnormWeightTerm<T>{data<const T>(dout), data<const T>(in), rstd.ptr<float>(), v},
                   AddToColumn<T>{data<T>(dweight)}, n, v.d);
    LT_CUDA_LAUNCHED("column_sums_kernel (rmsnorm_backward)");
    LT_LAUNCH(blocks_of(n, kRowsPerBlock), 32 * kRowsPerBlock, 0, compute_stream(), rmsnorm_backward_kernel<T>)
    (data<T>(din), data<const T>(dout), data<const T>(in), data<const T>(weight), rstd.ptr<float>(),
     data<const T>(dresidual), v, n);
  });
  LT_CUDA_LAUNCHED("rmsnorm_backward_kernel");
}

}  // namespace

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor in, Tensor weight, float eps) {
  rms_forward(out, rstd, in, weight, {1, weight.numel(), 0, 1}, eps);
}

void rmsnorm_backward(Tensor din, Tensor dweight, Tensor dout, Tensor in, Tensor weight, Tensor rstd,
                      Tensor dresidual) {
  rms_backward(din, dweight, dout, in, weight, rstd, dresidual, {1, weight.numel(), 0, 1});
}

void head_rmsnorm_forward(Tensor out, Tensor rstd, Tensor in, Tensor weight, int64_t first_head, int64_t count,
                          float eps) {
  rms_forward(out, rstd, in, weight, {in.shape[in.shape.rank() - 2], weight.numel(), first_head, count}, eps);
}

void head_rmsnorm_backward(Tensor din, Tensor dweight, Tensor dout, Tensor in, Tensor weight, Tensor rstd,
                           int64_t first_head, int64_t count) {
  rms_backward(din, dweight, dout, in, weight, rstd, Tensor{},
               {in.shape[in.shape.rank() - 2], weight.numel(), first_head, count});
}

}  // namespace llmtrain::kernels::cuda
