// RMSNorm (LLaMA), forward and backward, over whole rows and over single heads of a row (Qwen3's
// q_norm / k_norm: head_rmsnorm_*). Same reduction rule as layernorm.cpp: weight gradients are
// summed per thread over contiguous rows (or head vectors), then in thread order (bitwise
// reproducible).
//
// The rule a reader could get wrong: head_rmsnorm_backward may run in place (din == dout), so each
// head vector's dout is read whole (its sum and its weight-gradient terms) before its din is written.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/scratch.h"

namespace llmtrain::kernels::cpu {

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor in, Tensor weight, float eps) {
  const int64_t c = weight.numel(), n = in.numel() / c;
  const float *x = in.ptr<float>(), *w = weight.ptr<float>();
  float *o = out.ptr<float>(), *rs = rstd.ptr<float>();
#pragma omp parallel for schedule(static) if (n * c > 16384)
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * c;
    float ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < c; ++j) ss += xi[j] * xi[j];
    const float r = 1.0f / std::sqrt(ss / float(c) + eps);
    float* oi = o + i * c;
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) oi[j] = xi[j] * r * w[j];
    rs[i] = r;
  }
}

void rmsnorm_backward(Tensor din, Tensor dweight, Tensor dout, Tensor in, Tensor weight, Tensor rstd,
                      Tensor dresidual) {
  const int64_t c = weight.numel(), n = in.numel() / c;
  const float *x = in.ptr<float>(), *w = weight.ptr<float>(), *dy = dout.ptr<float>(), *rs = rstd.ptr<float>();
  const float* dres = dresidual.defined() ? dresidual.ptr<float>() : nullptr;
  float *dx = din.ptr<float>(), *dw = dweight.ptr<float>();
  const int nt = n * c > 16384 ? omp_get_max_threads() : 1;
  float* partials = thread_scratch(0, size_t(nt) * c);
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), used = omp_get_num_threads();
    float* pw = partials + size_t(t) * c;
    for (int64_t j = 0; j < c; ++j) pw[j] = 0;
    const int64_t per = (n + used - 1) / used, r0 = std::min(n, t * per), r1 = std::min(n, r0 + per);
    for (int64_t i = r0; i < r1; ++i) {
      const float *xi = x + i * c, *dyi = dy + i * c;
      const float r = rs[i];
      float s = 0;  // Σ dnorm·xhat
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < c; ++j) {
        const float xhat = xi[j] * r;
        s += dyi[j] * w[j] * xhat;
        pw[j] += dyi[j] * xhat;
      }
      s /= float(c);
      float* dxi = dx + i * c;
      const float* dri = dres ? dres + i * c : nullptr;
      if (dri) {
#pragma omp simd
        for (int64_t j = 0; j < c; ++j) dxi[j] = dri[j] + r * (dyi[j] * w[j] - xi[j] * r * s);
      } else {
#pragma omp simd
        for (int64_t j = 0; j < c; ++j) dxi[j] = r * (dyi[j] * w[j] - xi[j] * r * s);
      }
    }
#pragma omp barrier
#pragma omp for schedule(static)
    for (int64_t j = 0; j < c; ++j) {
      float sw = 0;
      for (int u = 0; u < used; ++u) sw += partials[size_t(u) * c + j];
      dw[j] += sw;
    }
  }
}

namespace {
// The head vectors [first_head, first_head + count) of every row of a [..., W, D] tensor, numbered
// k = n·count + (j − first_head) (rstd's order); at(k) is the offset of vector k's first value.
struct HeadVectors {
  int64_t width, d, first_head, count;
  int64_t total(int64_t numel) const { return numel / (width * d) * count; }
  int64_t at(int64_t k) const { return (k / count * width + first_head + k % count) * d; }
};
}  // namespace

void head_rmsnorm_forward(Tensor out, Tensor rstd, Tensor in, Tensor weight, int64_t first_head, int64_t count,
                          float eps) {
  const HeadVectors hv{in.shape[in.shape.rank() - 2], weight.numel(), first_head, count};
  const int64_t c = hv.d, n = hv.total(in.numel());
  const float *x = in.ptr<float>(), *w = weight.ptr<float>();
  float *o = out.ptr<float>(), *rs = rstd.ptr<float>();
#pragma omp parallel for schedule(static) if (n * c > 16384)
  for (int64_t k = 0; k < n; ++k) {
    const float* xk = x + hv.at(k);
    float ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < c; ++j) ss += xk[j] * xk[j];
    const float r = 1.0f / std::sqrt(ss / float(c) + eps);
    float* ok = o + hv.at(k);
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) ok[j] = xk[j] * r * w[j];
    rs[k] = r;
  }
}

void head_rmsnorm_backward(Tensor din, Tensor dweight, Tensor dout, Tensor in, Tensor weight, Tensor rstd,
                           int64_t first_head, int64_t count) {
  const HeadVectors hv{in.shape[in.shape.rank() - 2], weight.numel(), first_head, count};
  const int64_t c = hv.d, n = hv.total(in.numel());
  const float *x = in.ptr<float>(), *w = weight.ptr<float>(), *dy = dout.ptr<float>(), *rs = rstd.ptr<float>();
  float *dx = din.ptr<float>(), *dw = dweight.ptr<float>();
  const int nt = n * c > 16384 ? omp_get_max_threads() : 1;
  float* partials = thread_scratch(0, size_t(nt) * c);
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), used = omp_get_num_threads();
    float* pw = partials + size_t(t) * c;
    for (int64_t j = 0; j < c; ++j) pw[j] = 0;
    const int64_t per = (n + used - 1) / used, k0 = std::min(n, t * per), k1 = std::min(n, k0 + per);
    for (int64_t k = k0; k < k1; ++k) {
      const float *xk = x + hv.at(k), *dyk = dy + hv.at(k);
      const float r = rs[k];
      float s = 0;  // Σ dnorm·xhat
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < c; ++j) {
        const float xhat = xk[j] * r;
        s += dyk[j] * w[j] * xhat;
        pw[j] += dyk[j] * xhat;
      }
      s /= float(c);
      // In place (din == dout): element j of dout is read just before element j of din is written.
      float* dxk = dx + hv.at(k);
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) dxk[j] = r * (dyk[j] * w[j] - xk[j] * r * s);
    }
#pragma omp barrier
#pragma omp for schedule(static)
    for (int64_t j = 0; j < c; ++j) {
      float sw = 0;
      for (int u = 0; u < used; ++u) sw += partials[size_t(u) * c + j];
      dw[j] += sw;
    }
  }
}

}  // namespace llmtrain::kernels::cpu
