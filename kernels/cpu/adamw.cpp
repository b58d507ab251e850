// AdamW in one pass over a range of the flat buffers (PyTorch's torch.optim.AdamW arithmetic,
// formula in kernels/ops.h). Memory-bound: one read of p, g, m, v and one write of p, m, v per
// element, all threads.
#include <cmath>

#include "kernels/cpu/cpu_ops.h"

namespace llmtrain::kernels::cpu {

void adamw_update(Tensor params, Tensor grads, Tensor m, Tensor v, const AdamWStep& s) {
  const int64_t n = params.numel();
  float *p = params.ptr<float>(), *pm = m.ptr<float>(), *pv = v.ptr<float>();
  const float* g = grads.ptr<float>();
  const double bc1 = 1.0 - std::pow(double(s.beta1), double(s.step));
  const double bc2 = 1.0 - std::pow(double(s.beta2), double(s.step));
  const float step_size = float(double(s.lr) / bc1), inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  const float decay = 1.0f - s.lr * s.weight_decay, b1 = s.beta1, b2 = s.beta2, eps = s.eps, gs = s.grad_scale;
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * gs;
    const float mi = b1 * pm[i] + (1.0f - b1) * gi;
    const float vi = b2 * pv[i] + (1.0f - b2) * gi * gi;
    pm[i] = mi;
    pv[i] = vi;
    p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
  }
}

}  // namespace llmtrain::kernels::cpu
