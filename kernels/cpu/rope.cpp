// Rotary position embedding in Hugging Face's rotate-half convention: for i < D/2 the pair
// (x[i], x[i + D/2]) is rotated by the angle p·θ^(-2i/D):
//   y[i] = x[i]·cos - x[i+D/2]·sin,   y[i+D/2] = x[i+D/2]·cos + x[i]·sin.
// Backward applies the transposed (inverse) rotation to the gradient. Both work in place. The
// table's frequencies may be stretched for long contexts (RopeScaling: linear, llama3).
#include <cmath>
#include <numbers>

#include "kernels/cpu/cpu_ops.h"

namespace llmtrain::kernels::cpu {

namespace {
// The frequency of pair i of a head of d values, stretched as ops.h's RopeScaling says.
double inv_freq(int64_t i, int64_t d, double theta, const RopeScaling& s) {
  const double f = std::pow(theta, -double(2 * i) / double(d));
  switch (s.type) {
    case RopeScaling::Type::none:
      return f;
    case RopeScaling::Type::linear:
      return f / s.factor;
    case RopeScaling::Type::llama3: {
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen > s.original_max_positions / s.low_freq_factor) return f / s.factor;
      if (wavelen < s.original_max_positions / s.high_freq_factor) return f;
      const double smooth =
          (s.original_max_positions / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      return (1 - smooth) * f / s.factor + smooth * f;
    }
  }
  return f;
}
}  // namespace

void rope_table(Tensor table, double theta, RopeScaling scaling) {
  const int64_t p = table.shape[0], half = table.shape[2], d = 2 * half;
  float* t = table.ptr<float>();
  for (int64_t i = 0; i < half; ++i) {
    const double f = inv_freq(i, d, theta, scaling);
    for (int64_t pos = 0; pos < p; ++pos) {
      const double angle = double(pos) * f;
      t[pos * d + i] = float(std::cos(angle));
      t[pos * d + half + i] = float(std::sin(angle));
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
