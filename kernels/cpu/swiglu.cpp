// The gated activations over the fused [gate | up] projection rows. SwiGLU (LLaMA's MLP):
//   out = silu(g)·u,  silu(g) = g·σ(g)
//   dg = dout·u·σ(g)·(1 + g·(1 - σ(g))),  du = dout·silu(g)
// GeGLU (Gemma's), with gelu.cpp's tanh GELU written through s = σ(2v), v = √(2/π)·(g + 0.044715·g³):
//   out = gelu(g)·u,  gelu(g) = g·s
//   dg = dout·u·(s + 2·g·s·(1 - s)·dv/dg),  du = dout·gelu(g)
// gpt-oss's clamped SwiGLU, with g = min(gate, limit), u = clamp(up, ±limit), s = σ(alpha·g):
//   out = (u + 1)·g·s
//   dgate = dout·(u + 1)·s·(1 + alpha·g·(1 - s)) where gate ≤ limit, du = dout·g·s where |up| ≤ limit
#include <algorithm>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vec_math.h"

namespace llmtrain::kernels::cpu {

void swiglu_forward(Tensor out, Tensor in) {
  const int64_t f = out.shape[out.shape.rank() - 1], n = out.numel() / f;
  const float* x = in.ptr<float>();
  float* y = out.ptr<float>();
#pragma omp parallel for schedule(static) if (n * f > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const float *g = x + i * 2 * f, *u = g + f;
    float* yi = y + i * f;
#pragma omp simd
    for (int64_t j = 0; j < f; ++j) yi[j] = g[j] * sigmoid_approx(g[j]) * u[j];
  }
}

void swiglu_backward(Tensor din, Tensor dout, Tensor in) {
  const int64_t f = dout.shape[dout.shape.rank() - 1], n = dout.numel() / f;
  const float *x = in.ptr<float>(), *dy = dout.ptr<float>();
  float* dx = din.ptr<float>();
#pragma omp parallel for schedule(static) if (n * f > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const float *g = x + i * 2 * f, *u = g + f, *dyi = dy + i * f;
    float *dg = dx + i * 2 * f, *du = dg + f;
#pragma omp simd
    for (int64_t j = 0; j < f; ++j) {
      const float gj = g[j], uj = u[j], s = sigmoid_approx(gj);  // loaded first: din may alias in
      dg[j] = dyi[j] * uj * s * (1.0f + gj * (1.0f - s));
      du[j] = dyi[j] * gj * s;
    }
  }
}

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f, kGeluCoeff = 0.044715f;
}

void geglu_forward(Tensor out, Tensor in) {
  const int64_t f = out.shape[out.shape.rank() - 1], n = out.numel() / f;
  const float* x = in.ptr<float>();
  float* y = out.ptr<float>();
#pragma omp parallel for schedule(static) if (n * f > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const float *g = x + i * 2 * f, *u = g + f;
    float* yi = y + i * f;
#pragma omp simd
    for (int64_t j = 0; j < f; ++j) {
      const float gj = g[j];
      yi[j] = gj * sigmoid_approx(2.0f * kSqrt2OverPi * (gj + kGeluCoeff * gj * gj * gj)) * u[j];
    }
  }
}

void geglu_backward(Tensor din, Tensor dout, Tensor in) {
  const int64_t f = dout.shape[dout.shape.rank() - 1], n = dout.numel() / f;
  const float *x = in.ptr<float>(), *dy = dout.ptr<float>();
  float* dx = din.ptr<float>();
#pragma omp parallel for schedule(static) if (n * f > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const float *g = x + i * 2 * f, *u = g + f, *dyi = dy + i * f;
    float *dg = dx + i * 2 * f, *du = dg + f;
#pragma omp simd
    for (int64_t j = 0; j < f; ++j) {
      const float gj = g[j], uj = u[j];  // loaded first: din may alias in
      const float s = sigmoid_approx(2.0f * kSqrt2OverPi * (gj + kGeluCoeff * gj * gj * gj));
      const float dv = kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * gj * gj);
      dg[j] = dyi[j] * uj * (s + 2.0f * gj * s * (1.0f - s) * dv);
      du[j] = dyi[j] * gj * s;
    }
  }
}

void swiglu_clamped_forward(Tensor out, Tensor in, float alpha, float limit) {
  const int64_t f = out.shape[out.shape.rank() - 1], n = out.numel() / f;
  const float* x = in.ptr<float>();
  float* y = out.ptr<float>();
#pragma omp parallel for schedule(static) if (n * f > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const float *g = x + i * 2 * f, *u = g + f;
    float* yi = y + i * f;
#pragma omp simd
    for (int64_t j = 0; j < f; ++j) {
      const float gj = std::min(g[j], limit), uj = std::clamp(u[j], -limit, limit);
      yi[j] = (uj + 1.0f) * gj * sigmoid_approx(alpha * gj);
    }
  }
}

void swiglu_clamped_backward(Tensor din, Tensor dout, Tensor in, float alpha, float limit) {
  const int64_t f = dout.shape[dout.shape.rank() - 1], n = dout.numel() / f;
  const float *x = in.ptr<float>(), *dy = dout.ptr<float>();
  float* dx = din.ptr<float>();
#pragma omp parallel for schedule(static) if (n * f > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const float *g = x + i * 2 * f, *u = g + f, *dyi = dy + i * f;
    float *dg = dx + i * 2 * f, *du = dg + f;
#pragma omp simd
    for (int64_t j = 0; j < f; ++j) {
      const float graw = g[j], uraw = u[j];  // loaded first: din may alias in
      const float gj = std::min(graw, limit), uj = std::clamp(uraw, -limit, limit), s = sigmoid_approx(alpha * gj);
      dg[j] = graw <= limit ? dyi[j] * (uj + 1.0f) * s * (1.0f + alpha * gj * (1.0f - s)) : 0.0f;
      du[j] = uraw >= -limit && uraw <= limit ? dyi[j] * gj * s : 0.0f;
    }
  }
}

}  // namespace llmtrain::kernels::cpu
