// SwiGLU on the device: in [N, 2F] = [gate | up] per row, out [N, F] = silu(gate)·up
// (kernels/cpu/swiglu.cpp's formulas, with the device's expf).
//
// The rule a reader could get wrong: din may alias in. One thread owns the pair (gate j, up j) of a
// row and reads both before writing either.
#include "kernels/cuda/storage.cuh"

namespace llmtrain::kernels::cuda {
namespace {

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

template <class T>
__global__ void swiglu_forward_kernel(T* __restrict__ out, const T* __restrict__ in, int64_t n, int64_t f) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n * f; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / f, j = i % f;
    const float g = load(in, row * 2 * f + j), u = load(in, row * 2 * f + f + j);
    store(out, i, g * sigmoid(g) * u);
  }
}

template <class T>
__global__ void swiglu_backward_kernel(T* din, const T* __restrict__ dout, const T* in, int64_t n, int64_t f) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n * f; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / f, j = i % f;
    const float g = load(in, row * 2 * f + j), u = load(in, row * 2 * f + f + j), s = sigmoid(g), dy = load(dout, i);
    store(din, row * 2 * f + j, dy * u * s * (1.0f + g * (1.0f - s)));
    store(din, row * 2 * f + f + j, dy * g * s);
  }
}

}  // namespace

// out [n, f] from in [n, 2f].
void swiglu_forward(Tensor out, Tensor in) {
  const int64_t f = in.shape[in.shape.rank() - 1] / 2, n = f ? out.numel() / f : 0;
  if (n * f == 0) return;
  with_storage(out, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_for(n * f, 256), 256, 0, compute_stream(), swiglu_forward_kernel<T>)
    (data<T>(out), data<const T>(in), n, f);
  });
  LT_CUDA_LAUNCHED("swiglu_forward_kernel");
}

void swiglu_backward(Tensor din, Tensor dout, Tensor in) {
  const int64_t f = in.shape[in.shape.rank() - 1] / 2, n = f ? dout.numel() / f : 0;
  if (n * f == 0) return;
  with_storage(din, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_for(n * f, 256), 256, 0, compute_stream(), swiglu_backward_kernel<T>)
    (data<T>(din), data<const T>(dout), data<const T>(in), n, f);
  });
  LT_CUDA_LAUNCHED("swiglu_backward_kernel");
}

}  // namespace llmtrain::kernels::cuda
