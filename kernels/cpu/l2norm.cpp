// The pieces of gradient clipping: Σ x² (in double, written as fp32, for the global norm) and
// in-place scaling.
//
// Rule a reader could get wrong: the sum is bitwise reproducible for a given thread count (fixed
// chunks, partials added in chunk order), so every rank of a data-parallel group that holds the
// same gradients computes the same norm.
#include <algorithm>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/stored.h"

namespace llmtrain::kernels::cpu {
namespace {

// Σ x² of one chunk in fp32 lanes: one function, so that sum_squares and sum_squares_chunks sum a
// chunk at the same address in the same order.
[[gnu::noinline]] float chunk_squares(const float* p, int64_t n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += p[i] * p[i];
  return s;
}

}  // namespace

void sum_squares(Tensor out, Tensor x) {
  const int64_t n = x.numel();
  const float* p = x.ptr<float>();
  constexpr int64_t kChunk = kSquaresChunk;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  // Per chunk: float lanes (vectorized) over 16K elements; the chunk sums are added in double,
  // in chunk order.
  double* partial = reinterpret_cast<double*>(thread_scratch(1, size_t(chunks) * 2));
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t i0 = c * kChunk, i1 = std::min(n, i0 + kChunk);
    partial[c] = double(chunk_squares(p + i0, i1 - i0));
  }
  double total = 0;
  for (int64_t c = 0; c < chunks; ++c) total += partial[c];
  out.ptr<float>()[0] = float(total);
}

void sum_squares_chunks(Tensor out, Tensor x, Tensor chunks, Tensor first) {
  const int64_t c = chunks.shape[0], segments = out.numel();
  const int64_t *t = chunks.ptr<int64_t>(), *f = first.ptr<int64_t>();
  LT_CHECK(f[0] == 0 && f[segments] == c, "sum_squares_chunks: segments cover chunks [{}, {}) of {}", f[0], f[segments],
           c);
  int64_t total = 0;
  for (int64_t i = 0; i < c; ++i) {
    LT_CHECK(
        t[2 * i] >= 0 && t[2 * i + 1] >= 0 && t[2 * i + 1] <= kSquaresChunk && t[2 * i] + t[2 * i + 1] <= x.numel(),
        "sum_squares_chunks: chunk {} = [{}, +{}) outside {} elements", i, t[2 * i], t[2 * i + 1], x.numel());
    total += t[2 * i + 1];
  }
  for (int64_t j = 0; j < segments; ++j)
    LT_CHECK(f[j] <= f[j + 1], "sum_squares_chunks: segment {} ends before it starts", j);
  // Each chunk in fp32 lanes (sum_squares' loop), then each segment's chunks added in double, in order.
  double* partial = reinterpret_cast<double*>(thread_scratch(1, size_t(std::max<int64_t>(c, 1)) * 2));
  if (x.dtype == DType::fp32) {
    const float* p = x.ptr<float>();
#pragma omp parallel for schedule(static) if (total > 65536)
    for (int64_t i = 0; i < c; ++i) partial[i] = double(chunk_squares(p + t[2 * i], t[2 * i + 1]));
  } else {
    with_stored(x, [&](auto load) {
#pragma omp parallel for schedule(static) if (total > 65536)
      for (int64_t i = 0; i < c; ++i) {
        const int64_t i0 = t[2 * i], i1 = i0 + t[2 * i + 1];
        float s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t k = i0; k < i1; ++k) s += load(k) * load(k);
        partial[i] = double(s);
      }
    });
  }
  float* o = out.ptr<float>();
  for (int64_t j = 0; j < segments; ++j) {
    double sum = 0;
    for (int64_t i = f[j]; i < f[j + 1]; ++i) sum += partial[i];
    o[j] = float(sum);
  }
}

void scale(Tensor x, float s) {
  const int64_t n = x.numel();
  float* p = x.ptr<float>();
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) p[i] *= s;
}

}  // namespace llmtrain::kernels::cpu
