// The residual stream on the device: out = a + b (+ bias), and the bias gradient's column sums
// (kernels/cpu/residual.cpp is the reference; fp32 sums, in column_sums.cuh's order).
#include "kernels/cuda/column_sums.cuh"

namespace llmtrain::kernels::cuda {
namespace {

template <class T>
__global__ void residual_forward_kernel(T* out, const T* a, const T* b, const T* __restrict__ bias, int64_t total,
                                        int64_t c) {
  // out may alias a or b: each element is read before it is written, by the same thread.
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const float s = load(a, i) + load(b, i);
    store(out, i, bias != nullptr ? s + load(bias, i % c) : s);
  }
}

template <class T>
struct ColumnOf {
  const T* x;
  int64_t c;
  __device__ void operator()(int64_t r, int64_t j, float* v) const { v[0] = load(x, r * c + j); }
};

}  // namespace

void residual_forward_launch(Storage s, void* out, const void* a, const void* b, const void* bias, int64_t n,
                             int64_t c) {
  const int64_t total = n * c;
  if (total == 0) return;
  with_storage(s, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_for(total, 256), 256, 0, nullptr, residual_forward_kernel<T>)
    (static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), static_cast<const T*>(bias), total, c);
  });
}

void residual_backward_launch(Storage s, void* dbias, const void* dout, int64_t n, int64_t c) {
  if (c == 0) return;
  with_storage(s, [&](auto tag) {
    using T = decltype(tag);
    column_sums<1>(ColumnOf<T>{static_cast<const T*>(dout), c}, AddToColumn<T>{static_cast<T*>(dbias)}, n, c);
  });
}

}  // namespace llmtrain::kernels::cuda
