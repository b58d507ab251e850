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

void convert_launch(void* out, Storage out_storage, const void* in, Storage in_storage, int64_t n) {
  if (n == 0) return;
  with_storage(out_storage, [&](auto to) {
    using To = decltype(to);
    with_storage(in_storage, [&](auto from) {
      using From = decltype(from);
      LT_LAUNCH(blocks_for(n, 256), 256, 0, nullptr, convert_kernel<To, From>)
      (static_cast<To*>(out), static_cast<const From*>(in), n);
    });
  });
}

}  // namespace llmtrain::kernels::cuda
