// GELU, tanh approximation (GPT-2's "gelu_new"):
//   y = 0.5·x·(1 + tanh(u)),  u = √(2/π)·(x + 0.044715·x³)
//   dy/dx = 0.5·(1 + tanh u) + 0.5·x·(1 - tanh² u)·√(2/π)·(1 + 3·0.044715·x²)
// computed through s = σ(2u) = (1 + tanh u) / 2, one exp and one division per element:
//   y = x·s,  dy/dx = s + 2·x·s·(1 - s)·du/dx.
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vec_math.h"

namespace llmtrain::kernels::cpu {

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f, kCoeff = 0.044715f;
}

void gelu_forward(Tensor out, Tensor in) {
  const int64_t n = in.numel();
  const float* x = in.ptr<float>();
  float* y = out.ptr<float>();
#pragma omp parallel for simd schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    const float u = kSqrt2OverPi * (xi + kCoeff * xi * xi * xi);
    y[i] = xi * sigmoid_approx(2.0f * u);
  }
}

void gelu_backward(Tensor din, Tensor dout, Tensor in) {
  const int64_t n = in.numel();
  const float *x = in.ptr<float>(), *dy = dout.ptr<float>();
  float* dx = din.ptr<float>();
#pragma omp parallel for simd schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    const float u = kSqrt2OverPi * (xi + kCoeff * xi * xi * xi);
    const float s = sigmoid_approx(2.0f * u);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCoeff * xi * xi);
    dx[i] = dy[i] * (s + 2.0f * xi * s * (1.0f - s) * du);
  }
}

}  // namespace llmtrain::kernels::cpu
