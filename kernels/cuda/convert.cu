// Conversions between the float storage dtypes on the device: one rounding to nearest even, as
// kernels/cpu/convert.cpp does.
#include "kernels/cuda/storage.cuh"

namespace llmtrain::kernels::cuda {
namespace {

template <class To, class From>
__global__ void convert_kernel(To* __restrict__ out, const From* __restrict__ in, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store(out, i, load(in, i));
}

}  // namespace

// out = in: a device copy when the dtypes match, else the conversion kernel.
void convert(Tensor out, Tensor in) {
  const int64_t n = out.numel();
  if (out.dtype == in.dtype) {
    if (out.bytes() > 0 && out.data != in.data)
      LT_CUDA(cudaMemcpyAsync(out.data, in.data, out.bytes(), cudaMemcpyDeviceToDevice, compute_stream()));
    return;
  }
  if (n == 0) return;
  with_storage(out, [&](auto to) {
    using To = decltype(to);
    with_storage(in, [&](auto from) {
      using From = decltype(from);
      LT_LAUNCH(blocks_for(n, 256), 256, 0, compute_stream(), convert_kernel<To, From>)
      (data<To>(out), data<const From>(in), n);
    });
  });
  LT_CUDA_LAUNCHED("convert_kernel");
}

}  // namespace llmtrain::kernels::cuda
