// GELU (GPT-2's tanh approximation) on the device, as x·sigmoid(2u) with
// u = √(2/π)(x + 0.044715x³): kernels/cpu/gelu.cpp's formula, with the device's expf.
//
// The rule a reader could get wrong: din may alias dout (each element read, then written, by one
// thread).
#include "kernels/cuda/storage.cuh"

namespace llmtrain::kernels::cuda {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f, kCoeff = 0.044715f;

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

template <class T>
__global__ void gelu_forward_kernel(T* __restrict__ out, const T* __restrict__ in, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float x = load(in, i);
    store(out, i, x * sigmoid(2.0f * kSqrt2OverPi * (x + kCoeff * x * x * x)));
  }
}

template <class T>
__global__ void gelu_backward_kernel(T* din, const T* dout, const T* __restrict__ in, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float x = load(in, i);
    const float s = sigmoid(2.0f * kSqrt2OverPi * (x + kCoeff * x * x * x));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCoeff * x * x);
    store(din, i, load(dout, i) * (s + 2.0f * x * s * (1.0f - s) * du));
  }
}

}  // namespace

void gelu_forward(Tensor out, Tensor in) {
  const int64_t n = in.numel();
  if (n == 0) return;
  with_storage(out, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_for(n, 256), 256, 0, compute_stream(), gelu_forward_kernel<T>)(data<T>(out), data<const T>(in), n);
  });
  LT_CUDA_LAUNCHED("gelu_forward_kernel");
}

void gelu_backward(Tensor din, Tensor dout, Tensor in) {
  const int64_t n = in.numel();
  if (n == 0) return;
  with_storage(din, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_for(n, 256), 256, 0, compute_stream(), gelu_backward_kernel<T>)
    (data<T>(din), data<const T>(dout), data<const T>(in), n);
  });
  LT_CUDA_LAUNCHED("gelu_backward_kernel");
}

}  // namespace llmtrain::kernels::cuda
