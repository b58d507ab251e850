// The pieces of gradient clipping: Σ x² (in double, written as fp32, for the global norm) and
// in-place scaling.
//
// Rule a reader could get wrong: the sum is bitwise reproducible for a given thread count (fixed
// chunks, partials added in chunk order), so every rank of a data-parallel group that holds the
// same gradients computes the same norm.
#include <algorithm>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/scratch.h"

namespace llmtrain::kernels::cpu {

void sum_squares(Tensor out, Tensor x) {
  const int64_t n = x.numel();
  const float* p = x.ptr<float>();
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  // Per chunk: float lanes (vectorized) over 16K elements; the chunk sums are added in double,
  // in chunk order.
  double* partial = reinterpret_cast<double*>(thread_scratch(1, size_t(chunks) * 2));
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t i0 = c * kChunk, i1 = std::min(n, i0 + kChunk);
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = i0; i < i1; ++i) s += p[i] * p[i];
    partial[c] = double(s);
  }
  double total = 0;
  for (int64_t c = 0; c < chunks; ++c) total += partial[c];
  out.ptr<float>()[0] = float(total);
}

void scale(Tensor x, float s) {
  const int64_t n = x.numel();
  float* p = x.ptr<float>();
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) p[i] *= s;
}

}  // namespace llmtrain::kernels::cpu
