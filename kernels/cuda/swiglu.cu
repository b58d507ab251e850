// The gated activations on the device: in [N, 2F] = [gate | up] per row, out [N, F] = act(gate)·up
// with act silu (SwiGLU) or the tanh GELU (GeGLU): kernels/cpu/swiglu.cpp's formulas, with the
// device's expf.
//
// The rule a reader could get wrong: din may alias in. One thread owns the pair (gate j, up j) of a
// row and reads both before writing either.
#include "kernels/cuda/storage.cuh"

namespace llmtrain::kernels::cuda {
namespace {

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// The gate's activation and its derivative, one policy per op.
struct Silu {
  __device__ static float value(float g) { return g * sigmoid(g); }
  __device__ static float slope(float g) {
    const float s = sigmoid(g);
    return s * (1.0f + g * (1.0f - s));
  }
};
struct GeluTanh {
  static constexpr float kSqrt2OverPi = 0.7978845608028654f, kCoeff = 0.044715f;
  __device__ static float value(float g) { return g * sigmoid(2.0f * kSqrt2OverPi * (g + kCoeff * g * g * g)); }
  __device__ static float slope(float g) {
    const float s = sigmoid(2.0f * kSqrt2OverPi * (g + kCoeff * g * g * g));
    return s + 2.0f * g * s * (1.0f - s) * kSqrt2OverPi * (1.0f + 3.0f * kCoeff * g * g);
  }
};

template <class Act, class T>
__global__ void gated_forward_kernel(T* __restrict__ out, const T* __restrict__ in, int64_t n, int64_t f) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n * f; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / f, j = i % f;
    const float g = load(in, row * 2 * f + j), u = load(in, row * 2 * f + f + j);
    store(out, i, Act::value(g) * u);
  }
}

template <class Act, class T>
__global__ void gated_backward_kernel(T* din, const T* __restrict__ dout, const T* in, int64_t n, int64_t f) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n * f; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / f, j = i % f;
    const float g = load(in, row * 2 * f + j), u = load(in, row * 2 * f + f + j), dy = load(dout, i);
    store(din, row * 2 * f + j, dy * u * Act::slope(g));
    store(din, row * 2 * f + f + j, dy * Act::value(g));
  }
}

// out [n, f] from in [n, 2f].
template <class Act>
void gated_forward(Tensor out, Tensor in, const char* name) {
  const int64_t f = in.shape[in.shape.rank() - 1] / 2, n = f ? out.numel() / f : 0;
  if (n * f == 0) return;
  with_storage(out, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_for(n * f, 256), 256, 0, compute_stream(), gated_forward_kernel<Act, T>)
    (data<T>(out), data<const T>(in), n, f);
  });
  LT_CUDA_LAUNCHED(name);
}

template <class Act>
void gated_backward(Tensor din, Tensor dout, Tensor in, const char* name) {
  const int64_t f = in.shape[in.shape.rank() - 1] / 2, n = f ? dout.numel() / f : 0;
  if (n * f == 0) return;
  with_storage(din, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_for(n * f, 256), 256, 0, compute_stream(), gated_backward_kernel<Act, T>)
    (data<T>(din), data<const T>(dout), data<const T>(in), n, f);
  });
  LT_CUDA_LAUNCHED(name);
}

// gpt-oss's clamped SwiGLU (kernels/cpu/swiglu.cpp's formulas).
template <class T>
__global__ void swiglu_clamped_forward_kernel(T* __restrict__ out, const T* __restrict__ in, int64_t n, int64_t f,
                                              float alpha, float limit) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n * f; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / f, j = i % f;
    const float g = fminf(load(in, row * 2 * f + j), limit);
    const float u = fminf(fmaxf(load(in, row * 2 * f + f + j), -limit), limit);
    store(out, i, (u + 1.0f) * g * sigmoid(alpha * g));
  }
}

template <class T>
__global__ void swiglu_clamped_backward_kernel(T* din, const T* __restrict__ dout, const T* in, int64_t n, int64_t f,
                                               float alpha, float limit) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n * f; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / f, j = i % f;
    const float graw = load(in, row * 2 * f + j), uraw = load(in, row * 2 * f + f + j), dy = load(dout, i);
    const float g = fminf(graw, limit), u = fminf(fmaxf(uraw, -limit), limit), s = sigmoid(alpha * g);
    store(din, row * 2 * f + j, graw <= limit ? dy * (u + 1.0f) * s * (1.0f + alpha * g * (1.0f - s)) : 0.0f);
    store(din, row * 2 * f + f + j, uraw >= -limit && uraw <= limit ? dy * g * s : 0.0f);
  }
}

}  // namespace

void swiglu_clamped_forward(Tensor out, Tensor in, float alpha, float limit) {
  const int64_t f = in.shape[in.shape.rank() - 1] / 2, n = f ? out.numel() / f : 0;
  if (n * f == 0) return;
  with_storage(out, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_for(n * f, 256), 256, 0, compute_stream(), swiglu_clamped_forward_kernel<T>)
    (data<T>(out), data<const T>(in), n, f, alpha, limit);
  });
  LT_CUDA_LAUNCHED("swiglu_clamped_forward_kernel");
}

void swiglu_clamped_backward(Tensor din, Tensor dout, Tensor in, float alpha, float limit) {
  const int64_t f = in.shape[in.shape.rank() - 1] / 2, n = f ? dout.numel() / f : 0;
  if (n * f == 0) return;
  with_storage(din, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_for(n * f, 256), 256, 0, compute_stream(), swiglu_clamped_backward_kernel<T>)
    (data<T>(din), data<const T>(dout), data<const T>(in), n, f, alpha, limit);
  });
  LT_CUDA_LAUNCHED("swiglu_clamped_backward_kernel");
}

void swiglu_forward(Tensor out, Tensor in) { gated_forward<Silu>(out, in, "swiglu_forward_kernel"); }
void swiglu_backward(Tensor din, Tensor dout, Tensor in) {
  gated_backward<Silu>(din, dout, in, "swiglu_backward_kernel");
}
void geglu_forward(Tensor out, Tensor in) { gated_forward<GeluTanh>(out, in, "geglu_forward_kernel"); }
void geglu_backward(Tensor din, Tensor dout, Tensor in) {
  gated_backward<GeluTanh>(din, dout, in, "geglu_backward_kernel");
}

}  // namespace llmtrain::kernels::cuda
