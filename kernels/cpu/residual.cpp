// The residual stream: out = a + b (+ bias). Its backward passes dout through unchanged to both
// inputs (the model reuses the same gradient buffer), so only a bias has work to do.
#include "kernels/cpu/column_sum.h"
#include "kernels/cpu/cpu_ops.h"

namespace llmtrain::kernels::cpu {

void residual_forward(Tensor out, Tensor a, Tensor b, Tensor bias) {
  const int64_t total = out.numel(), c = bias.defined() ? bias.numel() : total, n = total / (c ? c : 1);
  const float *pa = a.ptr<float>(), *pb = b.ptr<float>();
  const float* bi = bias.defined() ? bias.ptr<float>() : nullptr;
  float* o = out.ptr<float>();
#pragma omp parallel for schedule(static) if (total > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t base = i * c;
    if (bi) {
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) o[base + j] = pa[base + j] + pb[base + j] + bi[j];
    } else {
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) o[base + j] = pa[base + j] + pb[base + j];
    }
  }
}

void residual_backward(Tensor dbias, Tensor dout) {
  const int64_t c = dbias.numel();
  column_sum_add(dbias.ptr<float>(), dout.ptr<float>(), dout.numel() / c, c);
}

}  // namespace llmtrain::kernels::cpu
