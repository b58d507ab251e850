// The residual stream on the device: out = a + b (+ bias), and the bias gradient's column sums
// (kernels/cpu/residual.cpp is the reference; the same fp32 sums in the same order per element).
#include "kernels/cuda/storage.cuh"

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

// One thread per column, rows in order: coalesced reads across a warp's columns.
template <class T>
__global__ void column_sum_add_kernel(T* __restrict__ dbias, const T* __restrict__ dout, int64_t n, int64_t c) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= c) return;
  float s = 0.0f;
  for (int64_t r = 0; r < n; ++r) s += load(dout, r * c + j);
  store(dbias, j, load(dbias, j) + s);
}

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
    LT_LAUNCH(unsigned((c + 127) / 128), 128, 0, nullptr, column_sum_add_kernel<T>)
    (static_cast<T*>(dbias), static_cast<const T*>(dout), n, c);
  });
}

}  // namespace llmtrain::kernels::cuda
