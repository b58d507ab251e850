// Attention of a block of query rows over a block of keys and values, with grouped-query heads,
// forward and backward, flash-style: the score matrix is never materialized. Work is split into
// blocks of kBlock query rows; for each block the scores against the keys it may see are computed
// into a per-thread scratch ([kBlock, keys] floats), softmaxed, and multiplied by V. Forward saves
// only the log-sum-exp of each query row; backward recomputes the probabilities from it.
//
// The core works on (pointer, row stride) views of one (sequence, head): token t of a head is at
// base + t·stride with its D values contiguous. q, k and v each hold their heads somewhere in a
// [B, T, H, D] tensor (the packed training layout [B, T, heads + 2·kv_heads, D] is all three; a KV
// cache [B, T_max, kv_heads, D] is k or v; kernels/ops.h's AttentionSpec says where).
//
// Which keys a row sees is an interval: query row i (position q_begin + i) sees key rows j in
// [lo(i), hi(i)), hi from the causal mask (or every key), lo from the sliding window (or 0). A
// block of rows works on the union of its rows' intervals, with the keys shifted so that the
// union starts at key 0: the products then see a prefix per row (Mask below) and the entries before
// a row's own lo are zeroed by value.
//
// Rules a reader could get wrong:
//  - A row that sees no key gets out = 0 and lse = -inf (context parallelism's partial blocks).
//  - Sinks join after the keys (add_sinks): the block kernels never see them; backward's
//    probabilities come from the final lse, which holds them.
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
// Three products, each in a register-blocked vector form written with GCC vector extensions (FMAs
// under -ffp-contract=fast), instantiated twice: W = 8 floats (AVX2, the build's baseline) and
// W = 16 (AVX-512, compiled for that target and picked at run time when the CPU has it and the
// head dim is a multiple of 16). Head dims that are not multiples of 8 use OpenBLAS. All run on
// the calling thread: they execute inside the parallel loops.

template <int W>
struct Vec {
  typedef float type __attribute__((vector_size(W * 4)));
  typedef float unaligned __attribute__((vector_size(W * 4), aligned(4), may_alias));
};
// Unaligned vector loads and stores of W floats (inside templates with W in scope).
#define LT_VLOAD(v, p) ((v) = *reinterpret_cast<const typename Vec<W>::unaligned*>(p))
#define LT_VSTORE(p, v) (*reinterpret_cast<typename Vec<W>::unaligned*>(p) = (v))

inline int64_t padded32(int64_t n) { return (n + 31) / 32 * 32; }

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

// The upper edge of the keys the rows of a block see: row r sees keys j < limit(r) (limit may be
// zero or negative for rows before the first key). The products compute every entry j < limit(r)
// and may leave others unset.
struct Causal {
  int64_t first;  // the keys visible to row 0
  int64_t kv_len;
  int64_t limit(int64_t r) const { return std::min(kv_len, first + r); }
  // The first row that sees key j.
  int64_t first_row(int64_t j) const { return std::max<int64_t>(0, j + 1 - first); }
};

// c[r][j] = alpha · Σ_k a.row(r)[k] · bt[k][j] for r < rows and j < cols, where bt is [d][ld]
// (ld % 32 == 0, zero-padded). Tiles of R rows × C·W columns; column tiles that no row of a group
// sees are skipped (their entries are left unset: callers read only j < causal.limit(r)).
template <int W, int R, int C>
[[gnu::always_inline]] inline void abt_tiles(float* c, int64_t ldc, HeadView a, int64_t rows, const float* bt,
                                             int64_t ld, int64_t cols, int64_t d, float alpha, Causal causal) {
  using V = typename Vec<W>::type;
  for (int64_t r0 = 0; r0 < rows; r0 += R) {
    const float* ar[R];
    for (int x = 0; x < R; ++x) ar[x] = a.row(std::min<int64_t>(r0 + x, rows - 1));
    const int64_t jend = std::min(cols, causal.limit(std::min<int64_t>(r0 + R - 1, rows - 1)));
    for (int64_t j = 0; j < jend; j += W * C) {
      V acc[R][C] = {};
      for (int64_t k = 0; k < d; ++k) {
        V b[C];
        for (int y = 0; y < C; ++y) LT_VLOAD(b[y], bt + k * ld + j + W * y);
        for (int x = 0; x < R; ++x)
          for (int y = 0; y < C; ++y) acc[x][y] += ar[x][k] * b[y];
      }
      for (int x = 0; x < R && r0 + x < rows; ++x)
        for (int y = 0; y < C; ++y) {
          const V out = alpha * acc[x][y];
          LT_VSTORE(c + (r0 + x) * ldc + j + W * y, out);
        }
    }
  }
}

// c.row(r)[k0 : k0 + W·NV] = alpha · row_scale[r] · Σ_j p[r][j] · b.row(j)[k0 : ...], R rows at a
// time; each group runs over the keys its last row sees (p is zero past each row's own limit).
template <int W, int R, int NV>
[[gnu::always_inline]] inline void ab_chunk(HeadView c, const float* p, int64_t ldp, int64_t rows, HeadView b,
                                            Causal causal, int64_t k0, float alpha, const float* row_scale) {
  using V = typename Vec<W>::type;
  for (int64_t r0 = 0; r0 < rows; r0 += R) {
    const float* pr[R];
    for (int x = 0; x < R; ++x) pr[x] = p + std::min<int64_t>(r0 + x, rows - 1) * ldp;
    const int64_t keys = causal.limit(std::min<int64_t>(r0 + R - 1, rows - 1));
    V acc[R][NV] = {};
    for (int64_t j = 0; j < keys; ++j) {
      const float* br = b.row(j) + k0;
      V bv[NV];
      for (int v = 0; v < NV; ++v) LT_VLOAD(bv[v], br + W * v);
      for (int x = 0; x < R; ++x)
        for (int v = 0; v < NV; ++v) acc[x][v] += pr[x][j] * bv[v];
    }
    for (int x = 0; x < R && r0 + x < rows; ++x) {
      const float s = row_scale ? alpha * row_scale[r0 + x] : alpha;
      for (int v = 0; v < NV; ++v) {
        const V out = s * acc[x][v];
        LT_VSTORE(c.row(r0 + x) + k0 + W * v, out);
      }
    }
  }
}

// c.row(j)[k0 : k0 + W·NV] += alpha · Σ_r p[r][j] · b.row(r)[k0 : ...], K keys at a time, over
// the rows that see the group's first key (p is zero past each row's limit).
template <int W, int K, int NV>
[[gnu::always_inline]] inline void atb_chunk(HeadView c, const float* p, int64_t ldp, int64_t rows, HeadView b,
                                             Causal causal, int64_t k0, float alpha) {
  using V = typename Vec<W>::type;
  const int64_t keys = causal.limit(rows - 1);
  for (int64_t j0 = 0; j0 < keys; j0 += K) {
    int64_t js[K];
    for (int y = 0; y < K; ++y) js[y] = std::min<int64_t>(j0 + y, keys - 1);
    V acc[K][NV] = {};
    for (int64_t r = causal.first_row(j0); r < rows; ++r) {
      const float* br = b.row(r) + k0;
      const float* prow = p + r * ldp;
      V bv[NV];
      for (int v = 0; v < NV; ++v) LT_VLOAD(bv[v], br + W * v);
      for (int y = 0; y < K; ++y)
        for (int v = 0; v < NV; ++v) acc[y][v] += prow[js[y]] * bv[v];
    }
    for (int y = 0; y < K && j0 + y < keys; ++y)
      for (int v = 0; v < NV; ++v) {
        float* out = c.row(j0 + y) + k0 + W * v;
        V cur;
        LT_VLOAD(cur, out);
        cur += alpha * acc[y][v];
        LT_VSTORE(out, cur);
      }
  }
}

// One implementation of the three products.
struct BlockProducts {
  void (*abt)(float* c, int64_t ldc, HeadView a, int64_t rows, const float* bt, int64_t ld, int64_t cols, int64_t d,
              float alpha, Causal causal);
  // c.row(r)[:d] = alpha · row_scale[r] · Σ_j p[r][j] · b.row(j)[:d] (row_scale may be null)
  void (*ab)(HeadView c, const float* p, int64_t ldp, int64_t rows, HeadView b, Causal causal, int64_t d, float alpha,
             const float* row_scale);
  // c.row(j)[:d] += alpha · Σ_r p[r][j] · b.row(r)[:d]
  void (*atb)(HeadView c, const float* p, int64_t ldp, int64_t rows, HeadView b, Causal causal, int64_t d, float alpha);
};

// W-wide products: tiles and chunk widths sized to the register file (16 registers for AVX2,
// 32 for AVX-512). The head dim must be a multiple of W.
template <int W, int AR, int AC, int BR, int BNV, int TK, int TNV>
struct VectorProducts {
  [[gnu::always_inline]] static void abt(float* c, int64_t ldc, HeadView a, int64_t rows, const float* bt, int64_t ld,
                                         int64_t cols, int64_t d, float alpha, Causal causal) {
    abt_tiles<W, AR, AC>(c, ldc, a, rows, bt, ld, cols, d, alpha, causal);
  }
  [[gnu::always_inline]] static void ab(HeadView c, const float* p, int64_t ldp, int64_t rows, HeadView b,
                                        Causal causal, int64_t d, float alpha, const float* row_scale) {
    int64_t k0 = 0;
    for (; k0 + W * BNV <= d; k0 += W * BNV) ab_chunk<W, BR, BNV>(c, p, ldp, rows, b, causal, k0, alpha, row_scale);
    for (; k0 < d; k0 += W) ab_chunk<W, BR, 1>(c, p, ldp, rows, b, causal, k0, alpha, row_scale);
  }
  [[gnu::always_inline]] static void atb(HeadView c, const float* p, int64_t ldp, int64_t rows, HeadView b,
                                         Causal causal, int64_t d, float alpha) {
    int64_t k0 = 0;
    for (; k0 + W * TNV <= d; k0 += W * TNV) atb_chunk<W, TK, TNV>(c, p, ldp, rows, b, causal, k0, alpha);
    for (; k0 < d; k0 += W) atb_chunk<W, TK, 1>(c, p, ldp, rows, b, causal, k0, alpha);
  }
};

using Avx2Products = VectorProducts<8, 4, 2, 4, 2, 4, 2>;
void abt_avx2(float* c, int64_t ldc, HeadView a, int64_t rows, const float* bt, int64_t ld, int64_t cols, int64_t d,
              float alpha, Causal causal) {
  Avx2Products::abt(c, ldc, a, rows, bt, ld, cols, d, alpha, causal);
}
void ab_avx2(HeadView c, const float* p, int64_t ldp, int64_t rows, HeadView b, Causal causal, int64_t d, float alpha,
             const float* row_scale) {
  Avx2Products::ab(c, p, ldp, rows, b, causal, d, alpha, row_scale);
}
void atb_avx2(HeadView c, const float* p, int64_t ldp, int64_t rows, HeadView b, Causal causal, int64_t d,
              float alpha) {
  Avx2Products::atb(c, p, ldp, rows, b, causal, d, alpha);
}

#if defined(__x86_64__)
#define LT_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))
using Avx512Products = VectorProducts<16, 8, 2, 4, 2, 4, 2>;
LT_AVX512 void abt_avx512(float* c, int64_t ldc, HeadView a, int64_t rows, const float* bt, int64_t ld, int64_t cols,
                          int64_t d, float alpha, Causal causal) {
  Avx512Products::abt(c, ldc, a, rows, bt, ld, cols, d, alpha, causal);
}
LT_AVX512 void ab_avx512(HeadView c, const float* p, int64_t ldp, int64_t rows, HeadView b, Causal causal, int64_t d,
                         float alpha, const float* row_scale) {
  Avx512Products::ab(c, p, ldp, rows, b, causal, d, alpha, row_scale);
}
LT_AVX512 void atb_avx512(HeadView c, const float* p, int64_t ldp, int64_t rows, HeadView b, Causal causal, int64_t d,
                          float alpha) {
  Avx512Products::atb(c, p, ldp, rows, b, causal, d, alpha);
}
#endif

void abt_blas(float* c, int64_t ldc, HeadView a, int64_t rows, const float* bt, int64_t ld, int64_t cols, int64_t d,
              float alpha, Causal) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(rows), int(cols), int(d), alpha, a.base, int(a.stride), bt,
              int(ld), 0.0f, c, int(ldc));
}
void ab_blas(HeadView c, const float* p, int64_t ldp, int64_t rows, HeadView b, Causal causal, int64_t d, float alpha,
             const float* row_scale) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(rows), int(d), int(causal.limit(rows - 1)), alpha, p,
              int(ldp), b.base, int(b.stride), 0.0f, c.base, int(c.stride));
  if (row_scale)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < d; ++k) c.row(r)[k] *= row_scale[r];
}
void atb_blas(HeadView c, const float* p, int64_t ldp, int64_t rows, HeadView b, Causal causal, int64_t d,
              float alpha) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(causal.limit(rows - 1)), int(d), int(rows), alpha, p,
              int(ldp), b.base, int(b.stride), 1.0f, c.base, int(c.stride));
}

constexpr BlockProducts kBlas{abt_blas, ab_blas, atb_blas};
constexpr BlockProducts kAvx2{abt_avx2, ab_avx2, atb_avx2};
#if defined(__x86_64__)
constexpr BlockProducts kAvx512{abt_avx512, ab_avx512, atb_avx512};
#endif

AttentionIsa g_isa = AttentionIsa::automatic;

// The products for a head dim: the widest vector form that divides it, else BLAS.
const BlockProducts& products_for(int64_t d) {
  AttentionIsa isa = g_isa;
  if (isa == AttentionIsa::automatic) isa = cpu_has_avx512() ? AttentionIsa::avx512 : AttentionIsa::avx2;
#if defined(__x86_64__)
  if (isa == AttentionIsa::avx512 && d % 16 == 0) return kAvx512;
#endif
  if (isa != AttentionIsa::blas && d % 8 == 0) return kAvx2;
  return kBlas;
}

// ---- which keys a query row sees ----------------------------------------------------------------

// The mask of one (query block, key block) pair in key-row coordinates: query row i sees key rows
// [lo(i), hi(i)).
struct Mask {
  int64_t offset;  // q_begin − kv_begin: the key row at the query's own position
  int64_t keys;    // key rows
  bool causal;
  int64_t window;
  int64_t hi(int64_t i) const { return causal ? std::clamp<int64_t>(offset + i + 1, 0, keys) : keys; }
  int64_t lo(int64_t i) const { return window > 0 ? std::clamp<int64_t>(offset + i + 1 - window, 0, keys) : 0; }
  // The key rows any of the query rows [0, rows) sees: [0, end).
  int64_t end(int64_t rows) const { return rows > 0 ? hi(rows - 1) : 0; }
};

// The keys of query rows [i0, i1) shifted to start at their union's first key `first`, as the
// products take them.
struct BlockKeys {
  int64_t first, count;  // key rows [first, first + count)
  Causal causal;
  BlockKeys(const Mask& m, int64_t i0, int64_t i1)
      : first(m.lo(i0)),
        count(std::max<int64_t>(0, m.hi(i1 - 1) - m.lo(i0))),
        causal{m.causal ? m.offset + i0 + 1 - m.lo(i0) : m.keys, m.keys - m.lo(i0)} {}
  // The keys row r of the block sees, shifted: [lo(r), n(r)).
  int64_t n(int64_t r) const { return std::max<int64_t>(0, causal.limit(r)); }
};

// ---- forward and backward of one block of query rows ----------------------------------------

// Query rows [i0, i1) of one head: out rows and lse entries. kt is Kᵀ [d][ld] of the head's keys.
void forward_block(const BlockProducts& mm, HeadView q, const float* kt, int64_t ld, HeadView v, HeadView out,
                   float* lse, int64_t i0, int64_t i1, const Mask& mask, int64_t d, float scale) {
  const int64_t rows = i1 - i0;
  const BlockKeys bk(mask, i0, i1);
  if (bk.count == 0) {  // no row of the block sees a key
    for (int64_t r = 0; r < rows; ++r) {
      std::fill(out.row(i0 + r), out.row(i0 + r) + d, 0.0f);
      lse[i0 + r] = -std::numeric_limits<float>::infinity();
    }
    return;
  }
  const int64_t keys = bk.count, lds = padded32(keys);
  const float* ktb = kt + bk.first;
  const HeadView vb{v.row(bk.first), v.stride};
  float* s = thread_scratch(2, size_t(kBlock) * size_t(lds) + kBlock);
  float* inv = s + kBlock * lds;
  mm.abt(s, lds, HeadView{q.row(i0), q.stride}, rows, ktb, ld, keys, d, scale, bk.causal);
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * lds;
    const int64_t n = bk.n(r), j0 = std::min(n, mask.lo(i0 + r) - bk.first);
    float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
    for (int64_t j = j0; j < n; ++j) mx = std::max(mx, sr[j]);
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = j0; j < n; ++j) {
      const float e = exp_approx(sr[j] - mx);
      sr[j] = e;
      sum += e;
    }
    // Unnormalized here; the output rows are scaled by 1/sum after the product. Zero outside the
    // row's keys: the products read a little past a row's limit (row pairs, BLAS).
    for (int64_t j = 0; j < j0; ++j) sr[j] = 0.0f;
    for (int64_t j = n; j < keys; ++j) sr[j] = 0.0f;
    inv[r] = n > j0 ? 1.0f / sum : 0.0f;
    lse[i0 + r] = n > j0 ? mx + std::log(sum) : -std::numeric_limits<float>::infinity();
  }
  mm.ab(HeadView{out.row(i0), out.stride}, s, lds, rows, vb, bk.causal, d, 1.0f, inv);
}

// Backward of query rows [i0, i1) of one head: writes dq rows, adds into dk, dv rows. kt, vt are
// Kᵀ and Vᵀ [d][ld].
void backward_block(const BlockProducts& mm, HeadView q, const float* kt, const float* vt, int64_t ld, HeadView k,
                    HeadView out, HeadView dout, const float* lse, HeadView dq, HeadView dk, HeadView dv, int64_t i0,
                    int64_t i1, const Mask& mask, int64_t d, float scale) {
  const int64_t rows = i1 - i0;
  const BlockKeys bk(mask, i0, i1);
  if (bk.count == 0) {  // no row of the block sees a key: no gradient flows through it
    for (int64_t r = 0; r < rows; ++r) std::fill(dq.row(i0 + r), dq.row(i0 + r) + d, 0.0f);
    return;
  }
  const int64_t keys = bk.count, lds = padded32(keys);
  const Causal causal = bk.causal;
  const HeadView kb{k.row(bk.first), k.stride}, dkb{dk.row(bk.first), dk.stride}, dvb{dv.row(bk.first), dv.stride};
  float* p = thread_scratch(2, size_t(kBlock) * size_t(lds));
  float* dp = thread_scratch(3, size_t(kBlock) * size_t(lds));
  const HeadView qb{q.row(i0), q.stride}, dob{dout.row(i0), dout.stride};
  // P = exp(scale·Q·Kᵀ - lse); dP = dO·Vᵀ.
  mm.abt(p, lds, qb, rows, kt + bk.first, ld, keys, d, scale, causal);
  mm.abt(dp, lds, dob, rows, vt + bk.first, ld, keys, d, 1.0f, causal);
  for (int64_t r = 0; r < rows; ++r) {
    float *pr = p + r * lds, *dpr = dp + r * lds;
    const int64_t n = bk.n(r), j0 = std::min(n, mask.lo(i0 + r) - bk.first);
    const float l = lse[i0 + r];
    const float *o = out.row(i0 + r), *dor = dout.row(i0 + r);
    float delta = 0;  // rowsum(dO ∘ O)
#pragma omp simd reduction(+ : delta)
    for (int64_t c = 0; c < d; ++c) delta += o[c] * dor[c];
      // P and dS = P ∘ (dP - delta); zero outside the row's keys (the products read a little past
      // a row's limit: row pairs, BLAS).
#pragma omp simd
    for (int64_t j = j0; j < n; ++j) {
      const float pj = exp_approx(pr[j] - l);
      pr[j] = pj;
      dpr[j] = pj * (dpr[j] - delta);
    }
    for (int64_t j = 0; j < j0; ++j) pr[j] = dpr[j] = 0.0f;
    for (int64_t j = n; j < keys; ++j) pr[j] = dpr[j] = 0.0f;
  }
  mm.atb(dvb, p, lds, rows, dob, causal, d, 1.0f);                                       // dV += Pᵀ·dO
  mm.ab(HeadView{dq.row(i0), dq.stride}, dp, lds, rows, kb, causal, d, scale, nullptr);  // dQ = scale·dS·K
  mm.atb(dkb, dp, lds, rows, qb, causal, d, scale);                                      // dK += scale·dSᵀ·Q
}

// The heads of one of q, k, v (or their gradients, or out) inside its [B, T, width, D] tensor.
struct Heads {
  float* base;
  int64_t t, width, d, first;  // rows per sequence, heads per row, head dim, the first head used
  Heads(const Tensor& x, int64_t first_head)
      : base(static_cast<float*>(x.data)), t(x.shape[1]), width(x.shape[2]), d(x.shape[3]), first(first_head) {}
  // Head h (counted from `first`) of sequence s.
  HeadView head(int64_t s, int64_t h) const { return {base + (s * t * width + first + h) * d, width * d}; }
};

// What forward and backward of one call share: the sizes, the mask, the keys some query sees
// (only those are transposed, into [d][ld]), the softmax scale and the block products.
struct Walk {
  int64_t b, tq, d, heads, kv_heads, group;
  Mask mask;
  int64_t kv_len, ld;
  float scale;
  const BlockProducts& mm;
  Walk(const Tensor& q, const Tensor& k, const AttentionSpec& spec)
      : b(q.shape[0]),
        tq(q.shape[1]),
        d(q.shape[3]),
        heads(spec.heads),
        kv_heads(spec.kv_heads),
        group(heads / kv_heads),
        mask{spec.q_begin - spec.kv_begin, k.shape[1], spec.causal, spec.window},
        kv_len(mask.end(tq)),
        ld(padded32(kv_len)),
        scale(spec.softmax_scale(d)),
        mm(products_for(d)) {}
};

}  // namespace

void set_attention_isa(AttentionIsa isa) { g_isa = isa; }

bool cpu_has_avx512() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
  return has;
#else
  return false;
#endif
}

namespace {

// Attention sinks, once a call's keys are done: each row's (out, lse) joined with one more key of
// logit sinks[h] and value 0 — attention_merge with a zero partial result of lse sinks[h].
void add_sinks(const Walk& w, const Heads& oh, float* lse, const float* sinks) {
#pragma omp parallel for schedule(static)
  for (int64_t u = 0; u < w.b * w.heads; ++u) {
    const int64_t s = u / w.heads, h = u % w.heads;
    const float sink = sinks[h];
    for (int64_t i = 0; i < w.tq; ++i) {
      float& l = lse[u * w.tq + i];
      const float m = std::max(l, sink), total = std::log(std::exp(l - m) + std::exp(sink - m)) + m;
      const float keep = std::exp(l - total);  // 0 for a row that saw no key (l = -inf)
      float* o = oh.head(s, h).row(i);
      for (int64_t c = 0; c < w.d; ++c) o[c] *= keep;
      l = total;
    }
  }
}

// dsinks[h] −= Σ over head h's rows of e^(sinks[h] − lse)·(dout · out), summed in double in row order.
void sink_grads(const Walk& w, const Heads& oh, const Heads& doh, const float* lse, const float* sinks, float* dsinks) {
#pragma omp parallel for schedule(static)
  for (int64_t h = 0; h < w.heads; ++h) {
    double acc = 0;
    for (int64_t s = 0; s < w.b; ++s)
      for (int64_t i = 0; i < w.tq; ++i) {
        const float *o = oh.head(s, h).row(i), *g = doh.head(s, h).row(i);
        double delta = 0;
        for (int64_t c = 0; c < w.d; ++c) delta += double(o[c]) * double(g[c]);
        acc += std::exp(double(sinks[h]) - double(lse[(s * w.heads + h) * w.tq + i])) * delta;
      }
    dsinks[h] -= float(acc);
  }
}

}  // namespace

void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, Tensor sinks, const AttentionSpec& spec) {
  const Walk w(q, k, spec);
  const Heads qh(q, spec.q_head), kh(k, spec.k_head), vh(v, spec.v_head), oh(out.view({w.b, w.tq, w.heads, w.d}), 0);
  float* l = lse.ptr<float>();
  // One unit per (sequence, kv head): Kᵀ is built once and serves every query head of the group.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t u = 0; u < w.b * w.kv_heads; ++u) {
    const int64_t g = u % w.kv_heads, s = u / w.kv_heads;
    float* kt = thread_scratch(1, size_t(w.d * w.ld));
    transpose(kt, w.ld, kh.head(s, g), w.kv_len, w.d);
    for (int64_t h = g * w.group; h < (g + 1) * w.group; ++h)
      for (int64_t i0 = 0; i0 < w.tq; i0 += kBlock)
        forward_block(w.mm, qh.head(s, h), kt, w.ld, vh.head(s, g), oh.head(s, h), l + (s * w.heads + h) * w.tq, i0,
                      std::min(w.tq, i0 + kBlock), w.mask, w.d, w.scale);
  }
  if (sinks.defined()) add_sinks(w, oh, l, sinks.ptr<float>());
}

void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dsinks, Tensor dout, Tensor q, Tensor k, Tensor v,
                        Tensor out, Tensor lse, Tensor sinks, const AttentionSpec& spec) {
  const Walk w(q, k, spec);
  const Heads qh(q, spec.q_head), kh(k, spec.k_head), vh(v, spec.v_head), dqh(dq, spec.q_head), dkh(dk, spec.k_head),
      dvh(dv, spec.v_head), oh(out.view({w.b, w.tq, w.heads, w.d}), 0), doh(dout.view({w.b, w.tq, w.heads, w.d}), 0);
  const float* l = lse.ptr<float>();
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t u = 0; u < w.b * w.kv_heads; ++u) {
    const int64_t g = u % w.kv_heads, s = u / w.kv_heads;
    const HeadView k_g = kh.head(s, g), dk_g = dkh.head(s, g), dv_g = dvh.head(s, g);
    float* kt = thread_scratch(0, size_t(2 * w.d * w.ld));
    float* vt = kt + w.d * w.ld;
    transpose(kt, w.ld, k_g, w.kv_len, w.d);
    transpose(vt, w.ld, vh.head(s, g), w.kv_len, w.d);
    for (int64_t i = 0; i < w.mask.keys; ++i) {  // every key row's gradient, also those no query sees
      std::fill(dk_g.row(i), dk_g.row(i) + w.d, 0.0f);
      std::fill(dv_g.row(i), dv_g.row(i) + w.d, 0.0f);
    }
    for (int64_t h = g * w.group; h < (g + 1) * w.group; ++h)
      for (int64_t i0 = 0; i0 < w.tq; i0 += kBlock)
        backward_block(w.mm, qh.head(s, h), kt, vt, w.ld, k_g, oh.head(s, h), doh.head(s, h),
                       l + (s * w.heads + h) * w.tq, dqh.head(s, h), dk_g, dv_g, i0, std::min(w.tq, i0 + kBlock),
                       w.mask, w.d, w.scale);
  }
  if (dsinks.defined()) sink_grads(w, oh, doh, l, sinks.ptr<float>(), dsinks.ptr<float>());
}

void attention_merge(Tensor out, Tensor lse, Tensor out_b, Tensor lse_b) {
  const int64_t b = out.shape[0], t = out.shape[1], heads = out.shape[2], d = out.shape[3];
  float *o = out.ptr<float>(), *l = lse.ptr<float>();
  const float *ob = out_b.ptr<float>(), *lb = lse_b.ptr<float>();
  constexpr float kNone = -std::numeric_limits<float>::infinity();
#pragma omp parallel for schedule(static) if (b * t * heads * d > 65536)
  for (int64_t row = 0; row < b * t * heads; ++row) {
    const int64_t s = row / (t * heads), i = row / heads % t, h = row % heads;
    float& la = l[(s * heads + h) * t + i];
    const float lbv = lb[(s * heads + h) * t + i];
    float* oa = o + row * d;
    const float* obr = ob + row * d;
    if (lbv == kNone) continue;  // the second part saw no key
    if (la == kNone) {
      std::copy(obr, obr + d, oa);
      la = lbv;
      continue;
    }
    const float m = std::max(la, lbv), wa = std::exp(la - m), wb = std::exp(lbv - m), sum = wa + wb;
    const float fa = wa / sum, fb = wb / sum;
    for (int64_t c = 0; c < d; ++c) oa[c] = oa[c] * fa + obr[c] * fb;
    la = m + std::log(sum);
  }
}

void kv_cache_write(Tensor k_cache, Tensor v_cache, Tensor qkv, int64_t heads, int64_t kv_heads, int64_t position) {
  const int64_t b = qkv.shape[0], t = qkv.shape[1], d = qkv.shape[3], row = (heads + 2 * kv_heads) * d;
  const int64_t t_max = k_cache.shape[1], width = kv_heads * d;
  const float* x = qkv.ptr<float>();
  float *kc = k_cache.ptr<float>(), *vc = v_cache.ptr<float>();
  for (int64_t s = 0; s < b; ++s)
    for (int64_t i = 0; i < t; ++i) {
      const float* src = x + (s * t + i) * row + heads * d;  // k heads, then v heads
      const int64_t at = (s * t_max + position + i) * width;
      std::copy(src, src + width, kc + at);
      std::copy(src + width, src + 2 * width, vc + at);
    }
}

}  // namespace llmtrain::kernels::cpu
