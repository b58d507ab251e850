// Rotary position embedding in Hugging Face's rotate-half convention: for i < D/2 the pair
// (x[i], x[i + D/2]) is rotated by the angle p·θ^(-2i/D):
//   y[i] = x[i]·cos - x[i+D/2]·sin,   y[i+D/2] = x[i+D/2]·cos + x[i]·sin.
// Backward applies the transposed rotation to the gradient. Both work in place. The table's
// frequencies may be stretched for long contexts (RopeScaling: linear, llama3, yarn; written in
// kernels/rope_math.h), and yarn scales its cos and sin (so the transpose is scaled too).
#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/rope_math.h"

namespace llmtrain::kernels::cpu {

void rope_table(Tensor table, double theta, RopeScaling scaling) {
  const int64_t p = table.shape[0], half = table.shape[2], d = 2 * half;
  float* t = table.ptr<float>();
  const double scale = rope_table_scale(scaling);
  for (int64_t i = 0; i < half; ++i) {
    const double f = scaled_inv_freq(i, d, theta, scaling);
    for (int64_t pos = 0; pos < p; ++pos) {
      const double angle = double(pos) * f;
      t[pos * d + i] = float(scale * std::cos(angle));
      t[pos * d + half + i] = float(scale * std::sin(angle));
    }
  }
}

namespace {
// sign = +1: forward rotation; -1: inverse.
void rotate(Tensor x, Tensor table, int64_t rotary_heads, int64_t pos_begin, float sign) {
  const int64_t b = x.shape[0], t = x.shape[1], heads = x.shape[2], d = x.shape[3], half = d / 2;
  const float* tab = table.ptr<float>();
  float* data = x.ptr<float>();
#pragma omp parallel for schedule(static) if (b * t * rotary_heads * d > 32768)
  for (int64_t row = 0; row < b * t; ++row) {
    const float* cs = tab + (pos_begin + row % t) * d;
    const float* sn = cs + half;
    for (int64_t h = 0; h < rotary_heads; ++h) {
      float* lo = data + (row * heads + h) * d;
      float* hi = lo + half;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const float a = lo[i], c = hi[i], s = sign * sn[i];
        lo[i] = a * cs[i] - c * s;
        hi[i] = c * cs[i] + a * s;
      }
    }
  }
}
}  // namespace

void rope_forward(Tensor x, Tensor table, int64_t rotary_heads, int64_t pos_begin) {
  rotate(x, table, rotary_heads, pos_begin, 1.0f);
}

void rope_backward(Tensor dx, Tensor table, int64_t rotary_heads, int64_t pos_begin) {
  rotate(dx, table, rotary_heads, pos_begin, -1.0f);
}

}  // namespace llmtrain::kernels::cpu
