// LayerNorm on the device (kernels/cpu/layernorm.cpp is the reference): one warp per row for the
// row statistics and the input gradient, column_sums.cuh for the parameter gradients
// (deterministic, no atomics).
//
// The rule a reader could get wrong: din may alias dresidual, so the row kernel reads an element
// of dresidual and writes the same element of din in one thread, and nothing else reads din.
#include "kernels/cuda/column_sums.cuh"

namespace llmtrain::kernels::cuda {
namespace {

constexpr int kRowsPerBlock = 4;  // warps of 32

template <class T>
__global__ void layernorm_forward_kernel(T* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                                         const T* __restrict__ in, const T* __restrict__ weight,
                                         const T* __restrict__ bias, int64_t n, int64_t c, float eps) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = int(threadIdx.x % 32);
  if (row >= n) return;  // the whole warp leaves together
  const T* x = in + row * c;
  float sum = 0.0f;
  for (int64_t j = lane; j < c; j += 32) sum += load(x, j);
  const float m = warp_sum(sum) / float(c);
  float var = 0.0f;
  for (int64_t j = lane; j < c; j += 32) {
    const float d = load(x, j) - m;
    var += d * d;
  }
  const float r = 1.0f / sqrtf(warp_sum(var) / float(c) + eps);
  for (int64_t j = lane; j < c; j += 32)
    store(out, row * c + j, (load(x, j) - m) * r * load(weight, j) + load(bias, j));
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

template <class T>
__global__ void layernorm_backward_kernel(T* din, const T* __restrict__ dout, const T* __restrict__ in,
                                          const T* __restrict__ weight, const float* __restrict__ mean,
                                          const float* __restrict__ rstd, const T* dresidual, int64_t n, int64_t c) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = int(threadIdx.x % 32);
  if (row >= n) return;
  const T *x = in + row * c, *dy = dout + row * c;
  const float m = mean[row], r = rstd[row];
  float s1 = 0.0f, s2 = 0.0f;  // Σ dnorm, Σ dnorm·xhat
  for (int64_t j = lane; j < c; j += 32) {
    const float dn = load(dy, j) * load(weight, j);
    s1 += dn;
    s2 += dn * (load(x, j) - m) * r;
  }
  s1 = warp_sum(s1) / float(c);
  s2 = warp_sum(s2) / float(c);
  for (int64_t j = lane; j < c; j += 32) {
    const float g = r * (load(dy, j) * load(weight, j) - s1 - (load(x, j) - m) * r * s2);
    store(din, row * c + j, dresidual != nullptr ? load(dresidual, row * c + j) + g : g);
  }
}

// The weight and bias gradients' terms of row r, column j.
template <class T>
struct LayernormParamTerms {
  const T *dout, *in;
  const float *mean, *rstd;
  int64_t c;
  __device__ void operator()(int64_t r, int64_t j, float* v) const {
    const float dy = load(dout, r * c + j);
    v[0] = dy * (load(in, r * c + j) - mean[r]) * rstd[r];
    v[1] = dy;
  }
};

template <class T>
struct AddToWeightAndBias {
  T *dweight, *dbias;
  __device__ void operator()(int64_t j, const float* sums) const {
    store(dweight, j, load(dweight, j) + sums[0]);
    store(dbias, j, load(dbias, j) + sums[1]);
  }
};

}  // namespace

void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor in, Tensor weight, Tensor bias, float eps) {
  const int64_t c = weight.numel(), n = c ? in.numel() / c : 0;
  if (n == 0) return;
  with_storage(out, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_of(n, kRowsPerBlock), 32 * kRowsPerBlock, 0, compute_stream(), layernorm_forward_kernel<T>)
    (data<T>(out), mean.ptr<float>(), rstd.ptr<float>(), data<const T>(in), data<const T>(weight), data<const T>(bias),
     n, c, eps);
  });
  LT_CUDA_LAUNCHED("layernorm_forward_kernel");
}

void layernorm_backward(Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in, Tensor weight, Tensor mean,
                        Tensor rstd, Tensor dresidual) {
  const int64_t c = weight.numel(), n = c ? in.numel() / c : 0;
  if (n == 0) return;
  with_storage(din, [&](auto tag) {
    using T = decltype(tag);
    column_sums<2>(
        LayernormParamTerms<T>{data<const T>(dout), data<const T>(in), mean.ptr<float>(), rstd.ptr<float>(), c},
        AddToWeightAndBias<T>{data<T>(dweight), data<T>(dbias)}, n, c);
    LT_CUDA_LAUNCHED("column_sums_kernel (layernorm_backward)");
    LT_LAUNCH(blocks_of(n, kRowsPerBlock), 32 * kRowsPerBlock, 0, compute_stream(), layernorm_backward_kernel<T>)
    (data<T>(din), data<const T>(dout), data<const T>(in), data<const T>(weight), mean.ptr<float>(), rstd.ptr<float>(),
     data<const T>(dresidual), n, c);
  });
  LT_CUDA_LAUNCHED("layernorm_backward_kernel");
}

}  // namespace llmtrain::kernels::cuda
