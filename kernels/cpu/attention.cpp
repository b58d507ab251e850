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

constexpr int64_t kBlock = 32;  // query rows per block

struct HeadView {
  float* base;
  int64_t stride;  // floats between consecutive tokens
  float* row(int64_t t) const { return base + t * stride; }
};

// ---- the block matrix products --------------------------------------------------------------
// Head dims that are multiples of 8 (every real model) use the register-blocked kernels below,
// written with GCC vector extensions (8 floats = one AVX2 register; FMAs under -ffp-contract=fast).
// Others fall back to OpenBLAS. Both are single-threaded: they run inside the parallel loops.

typedef float v8f __attribute__((vector_size(32)));
typedef float v8fu __attribute__((vector_size(32), aligned(4), may_alias));
inline v8f load8(const float* p) { return *reinterpret_cast<const v8fu*>(p); }
inline void store8(float* p, v8f v) { *reinterpret_cast<v8fu*>(p) = v; }

inline int64_t padded16(int64_t n) { return (n + 15) / 16 * 16; }

// dst [d][ld] = srcᵀ for tokens [0, n) of a head, zero in columns [n, ld). In tiles of 16 tokens:
// the 16 source rows stay in L1 while each destination row gets 16 contiguous floats.
void transpose(float* dst, int64_t ld, HeadView src, int64_t n, int64_t d) {
  for (int64_t j0 = 0; j0 < ld; j0 += 16) {
    const float* rows[16];
    for (int64_t x = 0; x < 16; ++x) rows[x] = j0 + x < n ? src.row(j0 + x) : nullptr;
    for (int64_t c = 0; c < d; ++c) {
      float* out = dst + c * ld + j0;
      for (int64_t x = 0; x < 16; ++x) out[x] = rows[x] ? rows[x][c] : 0.0f;
    }
  }
}

// Which keys the rows of a block see: row r (query q_pos + i0 + r) sees keys j < limit(r).
struct Causal {
  int64_t first;  // q_pos + i0 + 1: keys visible to row 0
  int64_t kv_len;
  int64_t limit(int64_t r) const { return std::min(kv_len, first + r); }
  // The first row that sees key j.
  int64_t first_row(int64_t j) const { return std::max<int64_t>(0, j + 1 - first); }
};

// c[r][j] = alpha · Σ_k a.row(r)[k] · bt[k][j] for r < rows and j < cols, where bt is [d][ld]
// (ld % 16 == 0, zero-padded). Column tiles that no row of a 4-row group sees are skipped (their
// entries are left unset: callers read only j < causal.limit(r)).
void mm_abt(float* c, int64_t ldc, HeadView a, int64_t rows, const float* bt, int64_t ld, int64_t cols, int64_t d,
            float alpha, Causal causal) {
  if (d % 8 != 0) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(rows), int(cols), int(d), alpha, a.base, int(a.stride),
                bt, int(ld), 0.0f, c, int(ldc));
    return;
  }
  for (int64_t r0 = 0; r0 < rows; r0 += 4) {
    const float* ar[4];
    for (int x = 0; x < 4; ++x) ar[x] = a.row(std::min(r0 + x, rows - 1));
    const int64_t jend = std::min(cols, causal.limit(std::min(r0 + 3, rows - 1)));
    for (int64_t j = 0; j < jend; j += 16) {
      v8f acc[4][2] = {};
      for (int64_t k = 0; k < d; ++k) {
        const v8f b0 = load8(bt + k * ld + j), b1 = load8(bt + k * ld + j + 8);
        for (int x = 0; x < 4; ++x) {
          acc[x][0] += ar[x][k] * b0;
          acc[x][1] += ar[x][k] * b1;
        }
      }
      for (int x = 0; x < 4 && r0 + x < rows; ++x) {
        float* cr = c + (r0 + x) * ldc + j;
        store8(cr, alpha * acc[x][0]);
        store8(cr + 8, alpha * acc[x][1]);
      }
    }
  }
}

// c.row(r)[k0 : k0 + 8·NV] = alpha · Σ_j p[r][j] · b.row(j)[k0 : ...] for two rows at a time.
template <int NV>
void ab_chunk(HeadView c, const float* p, int64_t ldp, int64_t rows, HeadView b, Causal causal, int64_t k0, float alpha,
              const float* row_scale) {
  for (int64_t r0 = 0; r0 < rows; r0 += 2) {
    const int64_t r1 = std::min(r0 + 1, rows - 1);
    const float* p0 = p + r0 * ldp;
    const float* p1 = p + r1 * ldp;
    // Row r0 sees one key fewer than r0 + 1 at most; its p entry there is zero by the callers.
    const int64_t keys = causal.limit(r1);
    v8f acc[2][NV] = {};
    for (int64_t j = 0; j < keys; ++j) {
      const float* br = b.row(j) + k0;
      const float s0 = p0[j], s1 = p1[j];
      for (int v = 0; v < NV; ++v) {
        const v8f bv = load8(br + 8 * v);
        acc[0][v] += s0 * bv;
        acc[1][v] += s1 * bv;
      }
    }
    const float a0 = row_scale ? alpha * row_scale[r0] : alpha, a1 = row_scale ? alpha * row_scale[r1] : alpha;
    for (int v = 0; v < NV; ++v) store8(c.row(r0) + k0 + 8 * v, a0 * acc[0][v]);
    if (r0 + 1 < rows)
      for (int v = 0; v < NV; ++v) store8(c.row(r0 + 1) + k0 + 8 * v, a1 * acc[1][v]);
  }
}

// c.row(r)[:d] = alpha · row_scale[r] · Σ_j p[r][j] · b.row(j)[:d] over the keys row r sees
// (row_scale may be null). p must be zero in [causal.limit(r), causal.limit(r + 1)).
void mm_ab(HeadView c, const float* p, int64_t ldp, int64_t rows, HeadView b, Causal causal, int64_t d, float alpha,
           const float* row_scale) {
  if (d % 8 != 0) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(rows), int(d), int(causal.limit(rows - 1)), alpha, p,
                int(ldp), b.base, int(b.stride), 0.0f, c.base, int(c.stride));
    if (row_scale)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < d; ++k) c.row(r)[k] *= row_scale[r];
    return;
  }
  int64_t k0 = 0;
  for (; k0 + 32 <= d; k0 += 32) ab_chunk<4>(c, p, ldp, rows, b, causal, k0, alpha, row_scale);
  for (; k0 < d; k0 += 8) ab_chunk<1>(c, p, ldp, rows, b, causal, k0, alpha, row_scale);
}

// c.row(j)[k0 : k0 + 8·NV] += alpha · Σ_r p[r][j] · b.row(r)[k0 : ...] for two keys at a time.
template <int NV>
void atb_chunk(HeadView c, const float* p, int64_t ldp, int64_t rows, HeadView b, Causal causal, int64_t k0,
               float alpha) {
  const int64_t keys = causal.limit(rows - 1);
  for (int64_t j0 = 0; j0 < keys; j0 += 2) {
    const int64_t j1 = std::min(j0 + 1, keys - 1);
    v8f acc[2][NV] = {};
    // Rows before first_row(j0) see neither key.
    for (int64_t r = causal.first_row(j0); r < rows; ++r) {
      const float* br = b.row(r) + k0;
      const float s0 = p[r * ldp + j0], s1 = p[r * ldp + j1];
      for (int v = 0; v < NV; ++v) {
        const v8f bv = load8(br + 8 * v);
        acc[0][v] += s0 * bv;
        acc[1][v] += s1 * bv;
      }
    }
    for (int v = 0; v < NV; ++v) {
      float* c0 = c.row(j0) + k0 + 8 * v;
      store8(c0, load8(c0) + alpha * acc[0][v]);
    }
    if (j1 != j0)
      for (int v = 0; v < NV; ++v) {
        float* c1 = c.row(j1) + k0 + 8 * v;
        store8(c1, load8(c1) + alpha * acc[1][v]);
      }
  }
}

// c.row(j)[:d] += alpha · Σ_r p[r][j] · b.row(r)[:d] over the rows that see key j. p must be zero
// beyond each row's causal limit.
void mm_atb_acc(HeadView c, const float* p, int64_t ldp, int64_t rows, HeadView b, Causal causal, int64_t d,
                float alpha) {
  if (d % 8 != 0) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(causal.limit(rows - 1)), int(d), int(rows), alpha, p,
                int(ldp), b.base, int(b.stride), 1.0f, c.base, int(c.stride));
    return;
  }
  int64_t k0 = 0;
  for (; k0 + 32 <= d; k0 += 32) atb_chunk<4>(c, p, ldp, rows, b, causal, k0, alpha);
  for (; k0 < d; k0 += 8) atb_chunk<1>(c, p, ldp, rows, b, causal, k0, alpha);
}

// ---- forward and backward of one block of query rows ----------------------------------------

// Query rows [i0, i1) of one head: out rows and lse entries. kt is Kᵀ [d][ld] of the head's keys.
void forward_block(HeadView q, const float* kt, int64_t ld, HeadView v, HeadView out, float* lse, int64_t i0,
                   int64_t i1, int64_t kv_len, int64_t q_pos, int64_t d, float scale) {
  const Causal causal{q_pos + i0 + 1, kv_len};
  const int64_t rows = i1 - i0, keys = causal.limit(rows - 1), lds = padded16(keys);
  float* s = thread_scratch(2, size_t(kBlock) * size_t(lds) + kBlock);
  float* inv = s + kBlock * lds;
  mm_abt(s, lds, HeadView{q.row(i0), q.stride}, rows, kt, ld, keys, d, scale, causal);
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * lds;
    const int64_t n = causal.limit(r);
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
    // Unnormalized here; the output rows are scaled by 1/sum after the product. Zero beyond the
    // causal edge: the products read a little past a row's limit (row pairs, BLAS).
    for (int64_t j = n; j < keys; ++j) sr[j] = 0.0f;
    inv[r] = 1.0f / sum;
    lse[i0 + r] = mx + std::log(sum);
  }
  mm_ab(HeadView{out.row(i0), out.stride}, s, lds, rows, v, causal, d, 1.0f, inv);
}

// Backward of query rows [i0, i1) of one head: writes dq rows, adds into dk, dv rows [0, keys).
// kt, vt are Kᵀ and Vᵀ [d][ld].
void backward_block(HeadView q, const float* kt, const float* vt, int64_t ld, HeadView k, HeadView out, HeadView dout,
                    const float* lse, HeadView dq, HeadView dk, HeadView dv, int64_t i0, int64_t i1, int64_t kv_len,
                    int64_t q_pos, int64_t d, float scale) {
  const Causal causal{q_pos + i0 + 1, kv_len};
  const int64_t rows = i1 - i0, keys = causal.limit(rows - 1), lds = padded16(keys);
  float* p = thread_scratch(2, size_t(kBlock) * size_t(lds));
  float* dp = thread_scratch(3, size_t(kBlock) * size_t(lds));
  const HeadView qb{q.row(i0), q.stride}, dob{dout.row(i0), dout.stride};
  // P = exp(scale·Q·Kᵀ - lse); dP = dO·Vᵀ.
  mm_abt(p, lds, qb, rows, kt, ld, keys, d, scale, causal);
  mm_abt(dp, lds, dob, rows, vt, ld, keys, d, 1.0f, causal);
  for (int64_t r = 0; r < rows; ++r) {
    float *pr = p + r * lds, *dpr = dp + r * lds;
    const int64_t n = causal.limit(r);
    const float l = lse[i0 + r];
    const float *o = out.row(i0 + r), *dor = dout.row(i0 + r);
    float delta = 0;  // rowsum(dO ∘ O)
#pragma omp simd reduction(+ : delta)
    for (int64_t c = 0; c < d; ++c) delta += o[c] * dor[c];
      // P and dS = P ∘ (dP - delta); zero beyond the causal edge (the products read a little past
      // a row's limit: row pairs, BLAS).
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
      const float pj = exp_approx(pr[j] - l);
      pr[j] = pj;
      dpr[j] = pj * (dpr[j] - delta);
    }
    for (int64_t j = n; j < keys; ++j) pr[j] = dpr[j] = 0.0f;
  }
  mm_atb_acc(dv, p, lds, rows, dob, causal, d, 1.0f);                                   // dV += Pᵀ·dO
  mm_ab(HeadView{dq.row(i0), dq.stride}, dp, lds, rows, k, causal, d, scale, nullptr);  // dQ = scale·dS·K
  mm_atb_acc(dk, dp, lds, rows, qb, causal, d, scale);                                  // dK += scale·dSᵀ·Q
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
  const int64_t group = heads / kv_heads, blocks = (pk.t + kBlock - 1) / kBlock, ld = padded16(pk.t);
  const float scale = float(1.0 / std::sqrt(double(pk.d)));
  // One unit per (sequence, kv head): Kᵀ is built once and serves every query head of the group.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t u = 0; u < pk.b * kv_heads; ++u) {
    const int64_t g = u % kv_heads, s = u / kv_heads;
    float* kt = thread_scratch(1, size_t(pk.d * ld));
    transpose(kt, ld, pk.k(x, s, g), pk.t, pk.d);
    for (int64_t h = g * group; h < (g + 1) * group; ++h)
      for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t i0 = blk * kBlock, i1 = std::min(pk.t, i0 + kBlock);
        forward_block(pk.q(x, s, h), kt, ld, pk.v(x, s, g), pk.o(o, s, h), l + (s * heads + h) * pk.t, i0, i1, pk.t, 0,
                      pk.d, scale);
      }
  }
}

void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int64_t heads, int64_t kv_heads) {
  const Packed pk(qkv, heads, kv_heads);
  float *x = qkv.ptr<float>(), *o = out.ptr<float>(), *dx = dqkv.ptr<float>(), *dy = dout.ptr<float>();
  const float* l = lse.ptr<float>();
  const int64_t group = heads / kv_heads, blocks = (pk.t + kBlock - 1) / kBlock, ld = padded16(pk.t);
  const float scale = float(1.0 / std::sqrt(double(pk.d)));
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t u = 0; u < pk.b * kv_heads; ++u) {
    const int64_t g = u % kv_heads, s = u / kv_heads;
    const HeadView k = pk.k(x, s, g), v = pk.v(x, s, g), dk = pk.k(dx, s, g), dv = pk.v(dx, s, g);
    float* kt = thread_scratch(0, size_t(2 * pk.d * ld));
    float* vt = kt + pk.d * ld;
    transpose(kt, ld, k, pk.t, pk.d);
    transpose(vt, ld, v, pk.t, pk.d);
    for (int64_t i = 0; i < pk.t; ++i) {
      std::fill(dk.row(i), dk.row(i) + pk.d, 0.0f);
      std::fill(dv.row(i), dv.row(i) + pk.d, 0.0f);
    }
    for (int64_t h = g * group; h < (g + 1) * group; ++h)
      for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t i0 = blk * kBlock, i1 = std::min(pk.t, i0 + kBlock);
        backward_block(pk.q(x, s, h), kt, vt, ld, k, pk.o(o, s, h), pk.o(dy, s, h), l + (s * heads + h) * pk.t,
                       pk.q(dx, s, h), dk, dv, i0, i1, pk.t, 0, pk.d, scale);
      }
  }
}

}  // namespace llmtrain::kernels::cpu
