// LayerNorm on the device (kernels/cpu/layernorm.cpp is the reference): one warp per row for the
// row statistics and the input gradient, one thread per column for the parameter gradients (rows
// in order: deterministic, no atomics).
//
// The rule a reader could get wrong: din may alias dresidual, so the row kernel reads an element
// of dresidual and writes the same element of din in one thread, and nothing else reads din.
#include "kernels/cuda/storage.cuh"

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

template <class T>
__global__ void layernorm_params_kernel(T* __restrict__ dweight, T* __restrict__ dbias, const T* __restrict__ dout,
                                        const T* __restrict__ in, const float* __restrict__ mean,
                                        const float* __restrict__ rstd, int64_t n, int64_t c) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= c) return;
  float sw = 0.0f, sb = 0.0f;
  for (int64_t r = 0; r < n; ++r) {
    const float dy = load(dout, r * c + j);
    sw += dy * (load(in, r * c + j) - mean[r]) * rstd[r];
    sb += dy;
  }
  store(dweight, j, load(dweight, j) + sw);
  store(dbias, j, load(dbias, j) + sb);
}

}  // namespace

void layernorm_forward_launch(Storage s, void* out, float* mean, float* rstd, const void* in, const void* weight,
                              const void* bias, int64_t n, int64_t c, float eps) {
  if (n == 0) return;
  with_storage(s, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(unsigned((n + kRowsPerBlock - 1) / kRowsPerBlock), 32 * kRowsPerBlock, 0, nullptr,
              layernorm_forward_kernel<T>)
    (static_cast<T*>(out), mean, rstd, static_cast<const T*>(in), static_cast<const T*>(weight),
     static_cast<const T*>(bias), n, c, eps);
  });
}

void layernorm_backward_launch(Storage s, void* din, void* dweight, void* dbias, const void* dout, const void* in,
                               const void* weight, const float* mean, const float* rstd, const void* dresidual,
                               int64_t n, int64_t c) {
  if (n == 0) return;
  with_storage(s, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(unsigned((c + 127) / 128), 128, 0, nullptr, layernorm_params_kernel<T>)
    (static_cast<T*>(dweight), static_cast<T*>(dbias), static_cast<const T*>(dout), static_cast<const T*>(in), mean,
     rstd, n, c);
    LT_LAUNCH(unsigned((n + kRowsPerBlock - 1) / kRowsPerBlock), 32 * kRowsPerBlock, 0, nullptr,
              layernorm_backward_kernel<T>)
    (static_cast<T*>(din), static_cast<const T*>(dout), static_cast<const T*>(in), static_cast<const T*>(weight), mean,
     rstd, static_cast<const T*>(dresidual), n, c);
  });
}

}  // namespace llmtrain::kernels::cuda
