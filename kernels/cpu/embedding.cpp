// Token and learned-position embeddings, forward and backward.
//
// Rules a reader could get wrong:
//  - The backward scatter-adds into rows chosen by the data, so it is parallel over channels
//    (every thread walks all tokens for its columns), never over tokens, which would race on
//    repeated ids.
//  - Ids are checked against the whole vocabulary where they are read: a shard skips the ids of
//    other shards, but an id no shard owns is a bug upstream, never a silent zero row.
#include <omp.h>

#include <algorithm>

#include "common/error.h"
#include "kernels/cpu/cpu_ops.h"

namespace llmtrain::kernels::cpu {

namespace {
// Column range [begin, end) of thread `t` of `nt` over `c` columns, in multiples of 16 floats.
std::pair<int64_t, int64_t> column_range(int64_t c, int t, int nt) {
  int64_t blocks = (c + 15) / 16, per = (blocks + nt - 1) / nt;
  return {std::min(c, t * per * 16), std::min(c, (t + 1) * per * 16)};
}
}  // namespace

void embedding_forward(Tensor out, Tensor tokens, Tensor wte, int64_t vocab_begin, int64_t vocab) {
  const int64_t n = tokens.numel(), v = wte.shape[0], c = wte.shape[1];
  const int32_t* tok = tokens.ptr<int32_t>();
  const float* w = wte.ptr<float>();
  float* o = out.ptr<float>();
#pragma omp parallel for schedule(static) if (n * c > 32768)
  for (int64_t i = 0; i < n; ++i) {
    LT_CHECK(tok[i] >= 0 && tok[i] < vocab, "token id {} at position {} is outside the vocabulary [0, {})", tok[i], i,
             vocab);
    int64_t row = int64_t(tok[i]) - vocab_begin;
    float* dst = o + i * c;
    if (row >= 0 && row < v)
      std::copy(w + row * c, w + row * c + c, dst);
    else
      std::fill(dst, dst + c, 0.0f);
  }
}

void embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int64_t vocab_begin, int64_t vocab) {
  const int64_t n = tokens.numel(), v = dwte.shape[0], c = dwte.shape[1];
  const int32_t* tok = tokens.ptr<int32_t>();
  const float* d = dout.ptr<float>();
  float* dw = dwte.ptr<float>();
#pragma omp parallel if (n * c > 32768)
  {
    // Plain variables, not a structured binding: clang 14 refuses bindings inside `omp simd`.
    const auto range = column_range(c, omp_get_thread_num(), omp_get_num_threads());
    const int64_t c0 = range.first, c1 = range.second;
    for (int64_t i = 0; i < n; ++i) {
      LT_CHECK(tok[i] >= 0 && tok[i] < vocab, "token id {} at position {} is outside the vocabulary [0, {})", tok[i], i,
               vocab);
      int64_t row = int64_t(tok[i]) - vocab_begin;
      if (row < 0 || row >= v) continue;
      float* dst = dw + row * c;
      const float* src = d + i * c;
#pragma omp simd
      for (int64_t j = c0; j < c1; ++j) dst[j] += src[j];
    }
  }
}

void position_embedding_forward(Tensor x, Tensor wpe, int64_t pos_begin) {
  const int64_t b = x.shape[0], t = x.shape[1], c = x.shape[2];
  const float* w = wpe.ptr<float>() + pos_begin * c;
  float* o = x.ptr<float>();
#pragma omp parallel for schedule(static) if (b * t * c > 32768)
  for (int64_t i = 0; i < b * t; ++i) {
    const float* src = w + (i % t) * c;
    float* dst = o + i * c;
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) dst[j] += src[j];
  }
}

void position_embedding_backward(Tensor dwpe, Tensor dx, int64_t pos_begin) {
  const int64_t b = dx.shape[0], t = dx.shape[1], c = dx.shape[2];
  float* dw = dwpe.ptr<float>() + pos_begin * c;
  const float* d = dx.ptr<float>();
#pragma omp parallel for schedule(static) if (b * t * c > 32768)
  for (int64_t p = 0; p < t; ++p) {
    float* dst = dw + p * c;
    for (int64_t s = 0; s < b; ++s) {
      const float* src = d + (s * t + p) * c;
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) dst[j] += src[j];
    }
  }
}

}  // namespace llmtrain::kernels::cpu
