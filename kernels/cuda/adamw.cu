// AdamW on the device (kernels/cpu/adamw.cpp is the reference): fp32 master weights and moments,
// gradients in any storage dtype, the step's constants computed once on the host exactly as the
// CPU computes them.
#include <cmath>

#include "kernels/cuda/storage.cuh"

namespace llmtrain::kernels::cuda {
namespace {

// adamw_rows: block b updates row b (offsets, count and decay from the table); with R the rounded
// parameters' storage type, each updated value is also rounded into them.
template <class G, class R>
__global__ void adamw_rows_kernel(float* __restrict__ p, const G* __restrict__ g, float* __restrict__ m,
                                  float* __restrict__ v, R* __restrict__ rounded, const int64_t* __restrict__ rows,
                                  float b1, float b2, float eps, float grad_scale, float decay, float step_size,
                                  float inv_sqrt_bc2) {
  const int64_t* row = rows + 6 * int64_t(blockIdx.x);
  const int64_t po = row[0], go = row[1], so = row[2], ro = row[3], n = row[4];
  const float d = row[5] != 0 ? decay : 1.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float gi = load(g, go + i) * grad_scale;
    const float mi = b1 * m[so + i] + (1.0f - b1) * gi;
    const float vi = b2 * v[so + i] + (1.0f - b2) * gi * gi;
    m[so + i] = mi;
    v[so + i] = vi;
    const float pi = p[po + i] * d - step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
    p[po + i] = pi;
    if (rounded) store(rounded, ro + i, pi);
  }
}

}  // namespace

void adamw_rows(Tensor params, Tensor grads, Tensor m, Tensor v, Tensor rounded, Tensor rows, const AdamWStep& s) {
  const int64_t r = rows.shape[0];
  if (r == 0) return;
  const double bc1 = 1.0 - std::pow(double(s.beta1), double(s.step));
  const double bc2 = 1.0 - std::pow(double(s.beta2), double(s.step));
  const float step_size = float(double(s.lr) / bc1), inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  const float decay = 1.0f - s.lr * s.weight_decay;
  // Without rounded parameters the kernel's R is float and its pointer null.
  const Tensor out = rounded.defined() ? rounded : params;
  with_storage(grads, [&](auto gtag) {
    using G = decltype(gtag);
    with_storage(out, [&](auto rtag) {
      using R = decltype(rtag);
      LT_LAUNCH(unsigned(r), 256, 0, compute_stream(), adamw_rows_kernel<G, R>)
      (params.ptr<float>(), data<const G>(grads), m.ptr<float>(), v.ptr<float>(),
       rounded.defined() ? data<R>(rounded) : nullptr, rows.ptr<int64_t>(), s.beta1, s.beta2, s.eps, s.grad_scale,
       decay, step_size, inv_sqrt_bc2);
    });
  });
  LT_CUDA_LAUNCHED("adamw_rows_kernel");
}

}  // namespace llmtrain::kernels::cuda
