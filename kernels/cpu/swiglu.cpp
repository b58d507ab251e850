// The gated activations over the fused [gate | up] projection rows. SwiGLU (LLaMA's MLP):
//   out = silu(g)·u,  silu(g) = g·σ(g)
//   dg = dout·u·σ(g)·(1 + g·(1 - σ(g))),  du = dout·silu(g)
// GeGLU (Gemma's), with gelu.cpp's tanh GELU written through s = σ(2v), v = √(2/π)·(g + 0.044715·g³):
//   out = gelu(g)·u,  gelu(g) = g·s
//   dg = dout·u·(s + 2·g·s·(1 - s)·dv/dg),  du = dout·gelu(g)
// gpt-oss's clamped SwiGLU, with g = min(gate, limit), u = clamp(up, ±limit), s = σ(alpha·g):
//   out = (u + 1)·g·s
//   dgate = dout·(u + 1)·s·(1 + alpha·g·(1 - s)) where gate ≤ limit, du = dout·g·s where |up| ≤ limit
// One row walk for all three (gated_forward, gated_backward), each activation a policy.
#include <algorithm>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vec_math.h"

namespace llmtrain::kernels::cpu {

namespace {

struct Silu {
  float value(float g, float u) const { return g * sigmoid_approx(g) * u; }
  void grads(float g, float u, float dy, float& dg, float& du) const {
    const float s = sigmoid_approx(g);
    dg = dy * u * s * (1.0f + g * (1.0f - s));
    du = dy * g * s;
  }
};

struct GeluTanh {
  static constexpr float kSqrt2OverPi = 0.7978845608028654f, kCoeff = 0.044715f;
  static float s(float g) { return sigmoid_approx(2.0f * kSqrt2OverPi * (g + kCoeff * g * g * g)); }
  float value(float g, float u) const { return g * s(g) * u; }
  void grads(float g, float u, float dy, float& dg, float& du) const {
    const float sg = s(g), dv = kSqrt2OverPi * (1.0f + 3.0f * kCoeff * g * g);
    dg = dy * u * (sg + 2.0f * g * sg * (1.0f - sg) * dv);
    du = dy * g * sg;
  }
};

struct Clamped {
  float alpha, limit;
  float value(float gate, float up) const {
    const float g = std::min(gate, limit), u = std::clamp(up, -limit, limit);
    return (u + 1.0f) * g * sigmoid_approx(alpha * g);
  }
  void grads(float gate, float up, float dy, float& dg, float& du) const {
    const float g = std::min(gate, limit), u = std::clamp(up, -limit, limit), s = sigmoid_approx(alpha * g);
    dg = gate <= limit ? dy * (u + 1.0f) * s * (1.0f + alpha * g * (1.0f - s)) : 0.0f;
    du = up >= -limit && up <= limit ? dy * g * s : 0.0f;
  }
};

// out [n, f] = act(gate, up) of in [n, 2f]'s rows.
template <class Act>
void gated_forward(Tensor out, Tensor in, const Act& act) {
  const int64_t f = out.shape[out.shape.rank() - 1], n = out.numel() / f;
  const float* x = in.ptr<float>();
  float* y = out.ptr<float>();
#pragma omp parallel for schedule(static) if (n * f > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const float *g = x + i * 2 * f, *u = g + f;
    float* yi = y + i * f;
#pragma omp simd
    for (int64_t j = 0; j < f; ++j) yi[j] = act.value(g[j], u[j]);
  }
}

// din [n, 2f] (may alias in) from dout [n, f].
template <class Act>
void gated_backward(Tensor din, Tensor dout, Tensor in, const Act& act) {
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
      float a, b;
      act.grads(gj, uj, dyi[j], a, b);
      dg[j] = a;
      du[j] = b;
    }
  }
}

}  // namespace

void swiglu_forward(Tensor out, Tensor in) { gated_forward(out, in, Silu{}); }
void swiglu_backward(Tensor din, Tensor dout, Tensor in) { gated_backward(din, dout, in, Silu{}); }
void geglu_forward(Tensor out, Tensor in) { gated_forward(out, in, GeluTanh{}); }
void geglu_backward(Tensor din, Tensor dout, Tensor in) { gated_backward(din, dout, in, GeluTanh{}); }
void swiglu_clamped_forward(Tensor out, Tensor in, float alpha, float limit) {
  gated_forward(out, in, Clamped{alpha, limit});
}
void swiglu_clamped_backward(Tensor din, Tensor dout, Tensor in, float alpha, float limit) {
  gated_backward(din, dout, in, Clamped{alpha, limit});
}

}  // namespace llmtrain::kernels::cpu
