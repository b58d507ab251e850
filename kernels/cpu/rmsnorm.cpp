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

namespace {

// The vectors one call normalizes: for whole rows {1, C, 0, 1}; for heads, [first_head, first_head +
// count) of every row of a [..., W, D] tensor, numbered k = n·count + (j − first_head) (rstd's
// order). at(k) is the offset of vector k's first value.
struct Vectors {
  int64_t width, d, first_head, count;
  int64_t total(int64_t numel) const { return numel / (width * d) * count; }
  int64_t at(int64_t k) const { return (k / count * width + first_head + k % count) * d; }
};

void rms_forward(const Vectors& v, int64_t n, const float* x, const float* w, float* o, float* rs, float eps) {
  const int64_t c = v.d;
#pragma omp parallel for schedule(static) if (n * c > 16384)
  for (int64_t k = 0; k < n; ++k) {
    const float* xk = x + v.at(k);
    float ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < c; ++j) ss += xk[j] * xk[j];
    const float r = 1.0f / std::sqrt(ss / float(c) + eps);
    float* ok = o + v.at(k);
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) ok[j] = xk[j] * r * w[j];
    rs[k] = r;
  }
}

// dres (optional): the residual stream's gradient, added to dx.
void rms_backward(const Vectors& v, int64_t n, const float* x, const float* w, const float* dy, const float* rs,
                  const float* dres, float* dx, float* dw) {
  const int64_t c = v.d;
  const int nt = n * c > 16384 ? omp_get_max_threads() : 1;
  float* partials = thread_scratch(0, size_t(nt) * c);
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), used = omp_get_num_threads();
    float* pw = partials + size_t(t) * c;
    for (int64_t j = 0; j < c; ++j) pw[j] = 0;
    const int64_t per = (n + used - 1) / used, k0 = std::min(n, t * per), k1 = std::min(n, k0 + per);
    for (int64_t k = k0; k < k1; ++k) {
      const float *xk = x + v.at(k), *dyk = dy + v.at(k);
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
      float* dxk = dx + v.at(k);
      const float* drk = dres ? dres + v.at(k) : nullptr;
      if (drk) {
#pragma omp simd
        for (int64_t j = 0; j < c; ++j) dxk[j] = drk[j] + r * (dyk[j] * w[j] - xk[j] * r * s);
      } else {
#pragma omp simd
        for (int64_t j = 0; j < c; ++j) dxk[j] = r * (dyk[j] * w[j] - xk[j] * r * s);
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

}  // namespace

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor in, Tensor weight, float eps) {
  const int64_t c = weight.numel();
  rms_forward({1, c, 0, 1}, in.numel() / c, in.ptr<float>(), weight.ptr<float>(), out.ptr<float>(), rstd.ptr<float>(),
              eps);
}

void rmsnorm_backward(Tensor din, Tensor dweight, Tensor dout, Tensor in, Tensor weight, Tensor rstd,
                      Tensor dresidual) {
  const int64_t c = weight.numel();
  rms_backward({1, c, 0, 1}, in.numel() / c, in.ptr<float>(), weight.ptr<float>(), dout.ptr<float>(), rstd.ptr<float>(),
               dresidual.defined() ? dresidual.ptr<float>() : nullptr, din.ptr<float>(), dweight.ptr<float>());
}

void head_rmsnorm_forward(Tensor out, Tensor rstd, Tensor in, Tensor weight, int64_t first_head, int64_t count,
                          float eps) {
  const Vectors v{in.shape[in.shape.rank() - 2], weight.numel(), first_head, count};
  rms_forward(v, v.total(in.numel()), in.ptr<float>(), weight.ptr<float>(), out.ptr<float>(), rstd.ptr<float>(), eps);
}

void head_rmsnorm_backward(Tensor din, Tensor dweight, Tensor dout, Tensor in, Tensor weight, Tensor rstd,
                           int64_t first_head, int64_t count) {
  const Vectors v{in.shape[in.shape.rank() - 2], weight.numel(), first_head, count};
  rms_backward(v, v.total(in.numel()), in.ptr<float>(), weight.ptr<float>(), dout.ptr<float>(), rstd.ptr<float>(),
               nullptr, din.ptr<float>(), dweight.ptr<float>());
}

}  // namespace llmtrain::kernels::cpu
