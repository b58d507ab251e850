// AdamW on the device (kernels/cpu/adamw.cpp is the reference): fp32 master weights and moments,
// gradients in any storage dtype, the step's constants computed once on the host exactly as the
// CPU computes them.
#include "kernels/cuda/storage.cuh"

namespace llmtrain::kernels::cuda {
namespace {

template <class G>
__global__ void adamw_kernel(float* __restrict__ p, const G* __restrict__ g, float* __restrict__ m,
                             float* __restrict__ v, int64_t n, float b1, float b2, float eps, float grad_scale,
                             float decay, float step_size, float inv_sqrt_bc2) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = load(g, i) * grad_scale;
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
  }
}

}  // namespace

void adamw_launch(Storage grads_storage, float* params, const void* grads, float* m, float* v, int64_t n, float beta1,
                  float beta2, float eps, float grad_scale, float decay, float step_size, float inv_sqrt_bc2) {
  if (n == 0) return;
  with_storage(grads_storage, [&](auto tag) {
    using G = decltype(tag);
    LT_LAUNCH(blocks_for(n, 256), 256, 0, nullptr, adamw_kernel<G>)
    (params, static_cast<const G*>(grads), m, v, n, beta1, beta2, eps, grad_scale, decay, step_size, inv_sqrt_bc2);
  });
}

}  // namespace llmtrain::kernels::cuda
