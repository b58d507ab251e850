// LayerNorm (GPT-2), forward and backward.
//
// Rule a reader could get wrong: the weight and bias gradients are sums over rows; each thread
// sums its contiguous block of rows into its own partial and the partials are added in thread
// order, so the result is bitwise reproducible for a given thread count (activation
// checkpointing's recomputation relies on that).
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/scratch.h"

namespace llmtrain::kernels::cpu {

void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor in, Tensor weight, Tensor bias, float eps) {
  const int64_t c = weight.numel(), n = in.numel() / c;
  const float *x = in.ptr<float>(), *w = weight.ptr<float>(), *b = bias.ptr<float>();
  float *o = out.ptr<float>(), *mu = mean.ptr<float>(), *rs = rstd.ptr<float>();
#pragma omp parallel for schedule(static) if (n * c > 16384)
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * c;
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < c; ++j) sum += xi[j];
    const float m = sum / float(c);
    float var = 0;
#pragma omp simd reduction(+ : var)
    for (int64_t j = 0; j < c; ++j) var += (xi[j] - m) * (xi[j] - m);
    const float r = 1.0f / std::sqrt(var / float(c) + eps);
    float* oi = o + i * c;
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) oi[j] = (xi[j] - m) * r * w[j] + b[j];
    mu[i] = m;
    rs[i] = r;
  }
}

void layernorm_backward(Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in, Tensor weight, Tensor mean,
                        Tensor rstd, Tensor dresidual) {
  const int64_t c = weight.numel(), n = in.numel() / c;
  const float *x = in.ptr<float>(), *w = weight.ptr<float>(), *dy = dout.ptr<float>();
  const float *mu = mean.ptr<float>(), *rs = rstd.ptr<float>();
  const float* dres = dresidual.defined() ? dresidual.ptr<float>() : nullptr;
  float *dx = din.ptr<float>(), *dw = dweight.ptr<float>(), *db = dbias.ptr<float>();
  const int nt = n * c > 16384 ? omp_get_max_threads() : 1;
  float* partials = thread_scratch(0, size_t(nt) * 2 * c);  // [thread][dw | db]
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), used = omp_get_num_threads();
    float* pw = partials + size_t(t) * 2 * c;
    float* pb = pw + c;
    for (int64_t j = 0; j < c; ++j) pw[j] = pb[j] = 0;
    const int64_t per = (n + used - 1) / used, r0 = std::min(n, t * per), r1 = std::min(n, r0 + per);
    for (int64_t i = r0; i < r1; ++i) {
      const float *xi = x + i * c, *dyi = dy + i * c;
      const float m = mu[i], r = rs[i];
      float s1 = 0, s2 = 0;  // Σ dnorm, Σ dnorm·xhat
#pragma omp simd reduction(+ : s1, s2)
      for (int64_t j = 0; j < c; ++j) {
        const float xhat = (xi[j] - m) * r, dn = dyi[j] * w[j];
        s1 += dn;
        s2 += dn * xhat;
        pw[j] += dyi[j] * xhat;
        pb[j] += dyi[j];
      }
      s1 /= float(c);
      s2 /= float(c);
      float* dxi = dx + i * c;
      const float* dri = dres ? dres + i * c : nullptr;
      if (dri) {
#pragma omp simd
        for (int64_t j = 0; j < c; ++j) dxi[j] = dri[j] + r * (dyi[j] * w[j] - s1 - (xi[j] - m) * r * s2);
      } else {
#pragma omp simd
        for (int64_t j = 0; j < c; ++j) dxi[j] = r * (dyi[j] * w[j] - s1 - (xi[j] - m) * r * s2);
      }
    }
#pragma omp barrier
#pragma omp for schedule(static)
    for (int64_t j = 0; j < c; ++j) {
      float sw = 0, sb = 0;
      for (int u = 0; u < used; ++u) {
        sw += partials[size_t(u) * 2 * c + j];
        sb += partials[size_t(u) * 2 * c + c + j];
      }
      dw[j] += sw;
      db[j] += sb;
    }
  }
}

}  // namespace llmtrain::kernels::cpu
