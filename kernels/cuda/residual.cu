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

void residual_forward(Tensor out, Tensor a, Tensor b, Tensor bias) {
  const int64_t total = out.numel(), c = bias.defined() ? bias.numel() : (total ? total : 1);
  if (total == 0) return;
  with_storage(out, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_for(total, 256), 256, 0, compute_stream(), residual_forward_kernel<T>)
    (data<T>(out), data<const T>(a), data<const T>(b), data<const T>(bias), total, c);
  });
  LT_CUDA_LAUNCHED("residual_forward_kernel");
}

// dbias [c] += the column sums of dout [n, c] (also the linear layer's bias gradient).
void residual_backward(Tensor dbias, Tensor dout) {
  const int64_t c = dbias.numel();
  if (c == 0) return;
  with_storage(dbias, [&](auto tag) {
    using T = decltype(tag);
    column_sums<1>(ColumnOf<T>{data<const T>(dout), c}, AddToColumn<T>{data<T>(dbias)}, dout.numel() / c, c);
  });
  LT_CUDA_LAUNCHED("column_sums_kernel (residual_backward)");
}

}  // namespace llmtrain::kernels::cuda
