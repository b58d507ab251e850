// Causal multi-head attention with grouped-query heads, forward and backward, flash-style: the
// [T, T] score matrix is never materialized. Work is split into blocks of kBlock query rows; for
// each block the scores against the keys it may see are computed into a per-thread scratch
// ([kBlock, keys] floats), softmaxed, and multiplied by V. Forward saves only the log-sum-exp of
// each query row; backward recomputes the probabilities from it.
//
// The core works on (pointer, row stride) views of one (sequence, head): token t of a head is at
// base + t·stride with its D values contiguous. The packed training layout [B, T, H + 2·KV, D] is
// one such view per head; a KV cache laid out [B, T_max, KV, D] is another, which is why the core
// takes a query position offset and separate query/key lengths.
//
// Rules a reader could get wrong:
//  - Query row i sits at position q_pos + i and sees keys j <= q_pos + i.
//  - In backward, the gradients of one kv head collect contributions from every query head of its
//    group, so the parallel unit is (sequence, kv head), never a query block: no two threads ever
//    write the same dK/dV rows, and the result is independent of the thread count.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/scratch.h"
#include "kernels/cpu/vec_math.h"

namespace llmtrain::kernels::cpu {

namespace {

constexpr int64_t kBlock = 64;  // query rows per block

struct HeadView {
  float* base;
  int64_t stride;  // floats between consecutive tokens
  float* row(int64_t t) const { return base + t * stride; }
};

// The keys query row `i` of a block starting at query `i0` may see, given the query offset.
inline int64_t visible_keys(int64_t q_pos, int64_t i, int64_t kv_len) { return std::min(kv_len, q_pos + i + 1); }

// One block of query rows [i0, i1) of one head: out rows and lse entries for those queries.
void forward_block(HeadView q, HeadView k, HeadView v, HeadView out, float* lse, int64_t i0, int64_t i1, int64_t kv_len,
                   int64_t q_pos, int64_t d, float scale) {
  const int64_t rows = i1 - i0, keys = visible_keys(q_pos, i1 - 1, kv_len);
  float* s = thread_scratch(2, size_t(kBlock) * size_t(keys));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(keys), int(d), scale, q.row(i0), int(q.stride),
              k.base, int(k.stride), 0.0f, s, int(keys));
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * keys;
    const int64_t n = visible_keys(q_pos, i0 + r, kv_len);
    float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, sr[j]);
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) {
      const float e = exp_approx(sr[j] - mx);
      sr[j] = e;
      sum += e;
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) sr[j] *= inv;
    for (int64_t j = n; j < keys; ++j) sr[j] = 0.0f;
    lse[i0 + r] = mx + std::log(sum);
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(rows), int(d), int(keys), 1.0f, s, int(keys), v.base,
              int(v.stride), 0.0f, out.row(i0), int(out.stride));
}

// Backward of one block of query rows of one head: writes dq rows [i0, i1), adds into dk, dv rows
// [0, keys).
void backward_block(HeadView q, HeadView k, HeadView v, HeadView out, HeadView dout, const float* lse, HeadView dq,
                    HeadView dk, HeadView dv, int64_t i0, int64_t i1, int64_t kv_len, int64_t q_pos, int64_t d,
                    float scale) {
  const int64_t rows = i1 - i0, keys = visible_keys(q_pos, i1 - 1, kv_len);
  float* p = thread_scratch(2, size_t(kBlock) * size_t(keys));
  float* dp = thread_scratch(3, size_t(kBlock) * size_t(keys));
  // P = exp(scale·Q·Kᵀ - lse), zero beyond the causal edge.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(keys), int(d), scale, q.row(i0), int(q.stride),
              k.base, int(k.stride), 0.0f, p, int(keys));
  for (int64_t r = 0; r < rows; ++r) {
    float* pr = p + r * keys;
    const int64_t n = visible_keys(q_pos, i0 + r, kv_len);
    const float l = lse[i0 + r];
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) pr[j] = exp_approx(pr[j] - l);
    for (int64_t j = n; j < keys; ++j) pr[j] = 0.0f;
  }
  // dV += Pᵀ·dO
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(keys), int(d), int(rows), 1.0f, p, int(keys), dout.row(i0),
              int(dout.stride), 1.0f, dv.base, int(dv.stride));
  // dP = dO·Vᵀ
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(keys), int(d), 1.0f, dout.row(i0),
              int(dout.stride), v.base, int(v.stride), 0.0f, dp, int(keys));
  // dS = P ∘ (dP - rowsum(dO ∘ O)), written over dp.
  for (int64_t r = 0; r < rows; ++r) {
    const float *o = out.row(i0 + r), *dor = dout.row(i0 + r);
    float delta = 0;
#pragma omp simd reduction(+ : delta)
    for (int64_t c = 0; c < d; ++c) delta += o[c] * dor[c];
    float *pr = p + r * keys, *dpr = dp + r * keys;
#pragma omp simd
    for (int64_t j = 0; j < keys; ++j) dpr[j] = pr[j] * (dpr[j] - delta);
  }
  // dQ = scale·dS·K;  dK += scale·dSᵀ·Q
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(rows), int(d), int(keys), scale, dp, int(keys), k.base,
              int(k.stride), 0.0f, dq.row(i0), int(dq.stride));
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(keys), int(d), int(rows), scale, dp, int(keys), q.row(i0),
              int(q.stride), 1.0f, dk.base, int(dk.stride));
}

struct Packed {
  int64_t b, t, heads, kv_heads, d, row;  // row: floats per token of the packed qkv
  Packed(const Tensor& qkv, int64_t h, int64_t kv)
      : b(qkv.shape[0]), t(qkv.shape[1]), heads(h), kv_heads(kv), d(qkv.shape[3]), row((h + 2 * kv) * qkv.shape[3]) {}
  HeadView q(float* qkv, int64_t s, int64_t h) const { return {qkv + s * t * row + h * d, row}; }
  HeadView k(float* qkv, int64_t s, int64_t g) const { return {qkv + s * t * row + (heads + g) * d, row}; }
  HeadView v(float* qkv, int64_t s, int64_t g) const { return {qkv + s * t * row + (heads + kv_heads + g) * d, row}; }
  HeadView o(float* out, int64_t s, int64_t h) const { return {out + (s * t * heads + h) * d, heads * d}; }
};

}  // namespace

void attention_forward(Tensor out, Tensor lse, Tensor qkv, int64_t heads, int64_t kv_heads) {
  const Packed pk(qkv, heads, kv_heads);
  float *x = qkv.ptr<float>(), *o = out.ptr<float>(), *l = lse.ptr<float>();
  const int64_t group = heads / kv_heads, blocks = (pk.t + kBlock - 1) / kBlock;
  const float scale = float(1.0 / std::sqrt(double(pk.d)));
  // Later query blocks see more keys: dynamic scheduling, largest blocks first.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t u = 0; u < pk.b * heads * blocks; ++u) {
    const int64_t blk = blocks - 1 - u % blocks, h = (u / blocks) % heads, s = u / (blocks * heads);
    const int64_t i0 = blk * kBlock, i1 = std::min(pk.t, i0 + kBlock);
    forward_block(pk.q(x, s, h), pk.k(x, s, h / group), pk.v(x, s, h / group), pk.o(o, s, h),
                  l + (s * heads + h) * pk.t, i0, i1, pk.t, 0, pk.d, scale);
  }
}

void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int64_t heads, int64_t kv_heads) {
  const Packed pk(qkv, heads, kv_heads);
  float *x = qkv.ptr<float>(), *o = out.ptr<float>(), *dx = dqkv.ptr<float>(), *dy = dout.ptr<float>();
  const float* l = lse.ptr<float>();
  const int64_t group = heads / kv_heads, blocks = (pk.t + kBlock - 1) / kBlock;
  const float scale = float(1.0 / std::sqrt(double(pk.d)));
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t u = 0; u < pk.b * kv_heads; ++u) {
    const int64_t g = u % kv_heads, s = u / kv_heads;
    const HeadView dk = pk.k(dx, s, g), dv = pk.v(dx, s, g);
    for (int64_t i = 0; i < pk.t; ++i) {
      std::fill(dk.row(i), dk.row(i) + pk.d, 0.0f);
      std::fill(dv.row(i), dv.row(i) + pk.d, 0.0f);
    }
    for (int64_t h = g * group; h < (g + 1) * group; ++h)
      for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t i0 = blk * kBlock, i1 = std::min(pk.t, i0 + kBlock);
        backward_block(pk.q(x, s, h), pk.k(x, s, g), pk.v(x, s, g), pk.o(o, s, h), pk.o(dy, s, h),
                       l + (s * heads + h) * pk.t, pk.q(dx, s, h), dk, dv, i0, i1, pk.t, 0, pk.d, scale);
      }
  }
}

}  // namespace llmtrain::kernels::cpu
