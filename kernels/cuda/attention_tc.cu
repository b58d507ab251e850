// Attention on the tensor cores, for bf16 and fp16 storage and head dims that are multiples of 16 up
// to 256 (kernels/cuda/attention.cu picks it, and keeps its fp32 kernels for the rest; the op's
// contract is kernels/op_table.def's and kernels/ops.h's AttentionSpec). FlashAttention 2's shape:
// a block owns 16 rows per warp of one side and streams tiles of the other side's rows through
// shared memory; every product is a sequence of 16×16×16 warp matrix operations (CUDA's WMMA,
// kernels/cuda/wmma.cuh) on 16-bit operands with fp32 accumulation, and the softmax statistics are
// fp32. Forward: S = Q·Kᵀ per key tile, an online softmax by the warp's lanes (two lanes a row),
// P rounded to the storage dtype, O += P·V. Backward, deterministic (no atomics, nothing summed
// across blocks): a kernel per (query tile, head) for dq, which also saves δ = dO·O per row, then
// one per (key tile, kv head) for dk and dv over every query head of its group.
//
// The rules a reader could get wrong: which element of a fragment a lane holds is CUDA's secret
// (the simulator draws it anew at every launch), so anything done per row — masking, the softmax,
// its rescaling of O, the final 1/l — happens on shared memory, where the layout is ours: a
// product is stored to the warp's scores (float) or added into its accumulator rows (float, loaded
// into a fragment and stored back), and lanes then work on the rows by index. Every WMMA call is
// made by all 32 lanes with the same pointer (so warp-uniform loops only), every pointer is 32-byte
// aligned (the regions are carved at 32-byte boundaries from a rounded-up base) and every leading
// dimension is a multiple of 8 halves or 4 floats. A lane writing a buffer that another lane's WMMA
// call read or wrote waits at __syncwarp first.
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

#include "kernels/backend_info.h"
#include "kernels/cuda/attention_operands.cuh"
#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/storage.cuh"
#include "kernels/cuda/wmma.cuh"
#include "kernels/op_profile.h"

namespace llmtrain::kernels::cuda {
namespace {

namespace wmma = nvcuda::wmma;
using attention::Heads;
using attention::Mask;
using attention::operands;
using attention::Operands;

constexpr int kEdge = 16;  // a fragment's rows, columns and depth
// Padding per shared row, so that rows fall in different banks: 32 bytes, which keeps every row's
// start 32-byte aligned (CUDA's guide asks leading dimensions of a multiple of 16 bytes; a multiple
// of 32 also satisfies the stricter reading that each row start be aligned like the pointer).
constexpr int kPad16 = 16;     // 16-bit elements
constexpr int kPad32 = 8;      // floats
constexpr size_t kAlign = 32;  // WMMA's pointer alignment, bytes
constexpr unsigned kAll = 0xffffffffu;
// The most dynamic shared memory a kernel may opt into on sm_80 and sm_90 (sm_80: 163 KiB).
constexpr size_t kMaxShared = 163 * 1024;

template <class T>
using FragA = wmma::fragment<wmma::matrix_a, kEdge, kEdge, kEdge, T, wmma::row_major>;
template <class T>
using FragBRows = wmma::fragment<wmma::matrix_b, kEdge, kEdge, kEdge, T, wmma::row_major>;
template <class T>
using FragBCols = wmma::fragment<wmma::matrix_b, kEdge, kEdge, kEdge, T, wmma::col_major>;
using FragAcc = wmma::fragment<wmma::accumulator, kEdge, kEdge, kEdge, float>;

// The three kernels, for the shared regions each needs.
enum class Kind { forward, dq, dkv };

// A kernel's tiles: `own` rows of its own side (16 a warp), `tile` rows of the streamed side per
// step, and the byte offsets of its shared regions from the 32-byte aligned base: 16-bit [own][ld]
// (q; dq: q, dO; dkv: k, v), 16-bit [tile][ld] (k, v; dkv: q, dO), float [own][ld_acc] accumulators
// (o; dq; dk, dv), float [own][ld_s] scores (s; dq, dkv: s, dp), 16-bit [own][ld_p] (p or ds) and,
// for dkv, float [tile] (the query rows' lse and δ).
struct Tiles {
  int warps, own, tile, nc;  // nc: d / 16
  int ld, ld_acc, ld_s, ld_p;
  size_t own_a, own_b, tile_a, tile_b, acc_a, acc_b, s_a, s_b, p, row_a, row_b, bytes;
};

__host__ __device__ constexpr size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

Tiles tiles_for(Kind kind, int warps, int tile, int64_t d) {
  Tiles t{};
  t.warps = warps;
  t.own = warps * kEdge;
  t.tile = tile;
  t.nc = int(d / kEdge);
  t.ld = int(d) + kPad16;
  t.ld_acc = int(d) + kPad32;
  t.ld_s = tile + kPad32;
  t.ld_p = tile + kPad16;
  size_t at = 0;
  auto take = [&](size_t n) {
    const size_t here = at;
    at += round_up(n);
    return here;
  };
  const size_t half = 2, own_rows = size_t(t.own) * t.ld * half, tile_rows = size_t(tile) * t.ld * half;
  const size_t acc = size_t(t.own) * t.ld_acc * sizeof(float), scores = size_t(t.own) * t.ld_s * sizeof(float);
  t.own_a = take(own_rows);
  if (kind != Kind::forward) t.own_b = take(own_rows);
  t.tile_a = take(tile_rows);
  t.tile_b = take(tile_rows);
  t.acc_a = take(acc);
  if (kind == Kind::dkv) t.acc_b = take(acc);
  t.s_a = take(scores);
  if (kind != Kind::forward) t.s_b = take(scores);
  t.p = take(size_t(t.own) * t.ld_p * half);
  if (kind == Kind::dkv) {
    t.row_a = take(size_t(tile) * sizeof(float));
    t.row_b = take(size_t(tile) * sizeof(float));
  }
  t.bytes = at + kAlign;  // room to round the base up
  return t;
}

// The largest tiles whose shared memory fits every GPU the build targets: 4 warps streaming 64
// rows where they fit, then fewer streamed rows, then 2 warps.
Tiles fit(Kind kind, int64_t d) {
  for (const auto& [warps, tile] : {std::pair{4, 64}, {4, 32}, {2, 32}, {2, 16}}) {
    const Tiles t = tiles_for(kind, warps, tile, d);
    if (t.bytes <= kMaxShared) return t;
  }
  not_supported("attention on tensor cores at head dim " + std::to_string(d), "a head dim of at most 256");
}

// The block's dynamic shared memory, rounded up to 32 bytes (CUDA promises 16).
__device__ unsigned char* aligned_base(unsigned char* smem) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(smem);
  return reinterpret_cast<unsigned char*>((p + kAlign - 1) / kAlign * kAlign);
}

// dst[j][0, d) = src[at(first + j) + (0, d)] for j < rows; zeros for rows at or past valid_end.
// d is a multiple of 16, so a row is whole 16-byte vectors (moved as such when `aligned`).
template <class T, class At>
__device__ void load_rows(T* dst, int ld, const T* src, int64_t first, int rows, int64_t valid_end, int64_t d,
                          bool aligned, At at) {
  const int vectors = int(d / 8);
  for (int e = int(threadIdx.x); e < rows * vectors; e += int(blockDim.x)) {
    const int j = e / vectors, c = e % vectors * 8;
    const int64_t row = first + j;
    uint4* to = reinterpret_cast<uint4*>(dst + int64_t(j) * ld + c);
    if (row >= valid_end) {
      *to = make_uint4(0, 0, 0, 0);
    } else if (aligned) {
      *to = *reinterpret_cast<const uint4*>(src + at(row) + c);
    } else {
      for (int i = 0; i < 8; ++i) dst[int64_t(j) * ld + c + i] = src[at(row) + c + i];
    }
  }
}

// s[16][cols] = A·Bᵀ: A the warp's 16 rows of d (16-bit, ld), B `cols` rows of d (16-bit, ld).
template <class T>
__device__ void scores(float* s, int ld_s, const T* a, const T* b, int cols, const Tiles& L) {
  for (int j = 0; j < cols / kEdge; ++j) {
    FragAcc acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int c = 0; c < L.nc; ++c) {
      FragA<T> fa;
      FragBCols<T> fb;
      wmma::load_matrix_sync(fa, a + c * kEdge, unsigned(L.ld));
      wmma::load_matrix_sync(fb, b + int64_t(j) * kEdge * L.ld + c * kEdge, unsigned(L.ld));
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(s + j * kEdge, acc, unsigned(ld_s), wmma::mem_row_major);
  }
}

// acc[16][d] += A·B: A the warp's 16 rows of `depth` (16-bit, ld_a), B `depth` rows of d (16-bit, ld).
template <class T>
__device__ void accumulate(float* acc_rows, const T* a, int ld_a, int depth, const T* b, const Tiles& L) {
  for (int c = 0; c < L.nc; ++c) {
    FragAcc acc;
    wmma::load_matrix_sync(acc, acc_rows + c * kEdge, unsigned(L.ld_acc), wmma::mem_row_major);
    for (int j = 0; j < depth / kEdge; ++j) {
      FragA<T> fa;
      FragBRows<T> fb;
      wmma::load_matrix_sync(fa, a + j * kEdge, unsigned(ld_a));
      wmma::load_matrix_sync(fb, b + int64_t(j) * kEdge * L.ld + c * kEdge, unsigned(L.ld));
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(acc_rows + c * kEdge, acc, unsigned(L.ld_acc), wmma::mem_row_major);
  }
}

// This thread's place in its warp's 16 rows: row r (two lanes a row), and half `half` of a row's
// columns.
struct Lane {
  int warp, r, half;
  __device__ Lane() : warp(int(threadIdx.x) / 32), r(int(threadIdx.x) % 32 / 2), half(int(threadIdx.x) % 2) {}
};

// The warp's rows of a [own][ld_acc] accumulator, zeroed by its lanes.
__device__ float* warp_rows(float* acc, const Tiles& L, const Lane& ln) {
  float* rows = acc + int64_t(ln.warp) * kEdge * L.ld_acc;
  for (int c = ln.half; c < L.nc * kEdge; c += 2) rows[ln.r * L.ld_acc + c] = 0.0f;
  return rows;
}

// Row r of the warp's accumulator rows, times `factor`, into dst at `at` (this lane's half).
template <class T>
__device__ void store_row(T* dst, int64_t at, const float* rows, float factor, const Tiles& L, const Lane& ln) {
  const int d = L.nc * kEdge, half = d / 2;
  for (int c = ln.half * half; c < (ln.half + 1) * half; ++c) store(dst, at + c, rows[ln.r * L.ld_acc + c] * factor);
}

// The forward's and the dq kernel's block: (query tile, head, sequence), tiles last-first (the
// causal mask makes the late ones the longest); this lane's query row, the kv head, and the key
// rows the block's rows see.
struct QueryBlock {
  int64_t b, h, q0, g, row, kv_begin, kv_end;
  template <class T>
  __device__ QueryBlock(const Operands<T>& x, const Tiles& L, const Lane& ln)
      : b(blockIdx.z),
        h(blockIdx.y),
        q0(int64_t(gridDim.x - 1 - blockIdx.x) * L.own),
        g(h / (x.heads / x.kv_heads)),
        row(q0 + ln.warp * kEdge + ln.r),
        kv_begin(x.mask.lo(q0)),
        kv_end(x.mask.hi((q0 + L.own < x.tq ? q0 + L.own : x.tq) - 1)) {}
  // Key rows [k0, k0 + L.tile) of kv head g into k_s and v_s (zeros past the keys).
  template <class T>
  __device__ void load_keys(T* k_s, T* v_s, const Operands<T>& x, int64_t k0, const Tiles& L) const {
    load_rows(k_s, L.ld, x.k, k0, L.tile, x.mask.keys, x.d, x.aligned, [&](int64_t r) { return x.kh.at(b, r, g); });
    load_rows(v_s, L.ld, x.v, k0, L.tile, x.mask.keys, x.d, x.aligned, [&](int64_t r) { return x.vh.at(b, r, g); });
  }
};

template <class T>
__global__ void attention_tc_forward_kernel(T* __restrict__ out, float* __restrict__ lse, Operands<T> x, Tiles L,
                                            float scale) {
  LT_DYNAMIC_SHARED(unsigned char, smem);
  unsigned char* base = aligned_base(smem);
  T* q_s = reinterpret_cast<T*>(base + L.own_a);
  T* k_s = reinterpret_cast<T*>(base + L.tile_a);
  T* v_s = reinterpret_cast<T*>(base + L.tile_b);
  const Lane ln;
  float* o_w = reinterpret_cast<float*>(base + L.acc_a);
  float* s_w = reinterpret_cast<float*>(base + L.s_a) + ln.warp * kEdge * L.ld_s;
  T* p_w = reinterpret_cast<T*>(base + L.p) + ln.warp * kEdge * L.ld_p;
  const QueryBlock qb(x, L, ln);
  const int64_t b = qb.b, h = qb.h, q0 = qb.q0, row = qb.row;
  load_rows(q_s, L.ld, x.q, q0, L.own, x.tq, x.d, x.aligned, [&](int64_t r) { return x.qh.at(b, r, h); });
  o_w = warp_rows(o_w, L, ln);
  const T* q_w = q_s + int64_t(ln.warp) * kEdge * L.ld;
  const int cols = L.tile / 2, c0 = ln.half * cols;
  float m = -INFINITY, l = 0.0f;
  for (int64_t k0 = qb.kv_begin; k0 < qb.kv_end; k0 += L.tile) {
    __syncthreads();  // nobody still reads the previous tile
    qb.load_keys(k_s, v_s, x, k0, L);
    __syncthreads();
    scores(s_w, L.ld_s, q_w, k_s, L.tile, L);
    __syncwarp();
    // The online softmax of this lane's half row: the tile's maximum over both halves, then the
    // rescaling of what the row summed so far.
    float* s_row = s_w + ln.r * L.ld_s;
    float tile_max = -INFINITY;
    for (int c = c0; c < c0 + cols; ++c) {
      s_row[c] = x.mask.visible(row, k0 + c) ? s_row[c] * scale : -INFINITY;
      tile_max = fmaxf(tile_max, s_row[c]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(kAll, tile_max, 1));
    const float m_new = fmaxf(m, tile_max), correction = m_new == -INFINITY ? 1.0f : expf(m - m_new);
    float sum = 0.0f;
    for (int c = c0; c < c0 + cols; ++c) {
      const float p = s_row[c] == -INFINITY ? 0.0f : expf(s_row[c] - m_new);
      sum += p;
      store(p_w, int64_t(ln.r) * L.ld_p + c, p);
    }
    sum += __shfl_xor_sync(kAll, sum, 1);
    l = l * correction + sum;
    m = m_new;
    const int d_half = L.nc * kEdge / 2;
    for (int c = ln.half * d_half; c < (ln.half + 1) * d_half; ++c) o_w[ln.r * L.ld_acc + c] *= correction;
    __syncwarp();
    accumulate(o_w, p_w, L.ld_p, L.tile, v_s, L);
    __syncwarp();
  }
  __syncwarp();
  if (row >= x.tq) return;
  // A row that saw no key: out = 0, lse = -inf (m is -inf and l is 0 then), or the sink's.
  float factor, row_lse;
  finish_row(x, h, m, l, factor, row_lse);
  store_row(out, x.oh.at(b, row, h), o_w, factor, L, ln);
  if (ln.half == 0) lse[x.lse_at(b, h, row)] = row_lse;
}

// dq_i = scale · Σ_j p_ij (dO_i·v_j − δ_i) k_j with p_ij = exp(scale q_i·k_j − lse_i) and
// δ_i = dO_i·O_i, which this kernel also saves for the dk/dv kernel.
template <class T>
__global__ void attention_tc_dq_kernel(T* __restrict__ dq, float* __restrict__ delta_out, const T* __restrict__ dout,
                                       const T* __restrict__ out, const float* __restrict__ lse, Operands<T> x, Tiles L,
                                       float scale) {
  LT_DYNAMIC_SHARED(unsigned char, smem);
  unsigned char* base = aligned_base(smem);
  T* q_s = reinterpret_cast<T*>(base + L.own_a);
  T* do_s = reinterpret_cast<T*>(base + L.own_b);
  T* k_s = reinterpret_cast<T*>(base + L.tile_a);
  T* v_s = reinterpret_cast<T*>(base + L.tile_b);
  const Lane ln;
  float* dq_w = reinterpret_cast<float*>(base + L.acc_a);
  float* s_w = reinterpret_cast<float*>(base + L.s_a) + ln.warp * kEdge * L.ld_s;
  float* dp_w = reinterpret_cast<float*>(base + L.s_b) + ln.warp * kEdge * L.ld_s;
  T* ds_w = reinterpret_cast<T*>(base + L.p) + ln.warp * kEdge * L.ld_p;
  const QueryBlock qb(x, L, ln);
  const int64_t b = qb.b, h = qb.h, q0 = qb.q0, row = qb.row;
  const bool active = row < x.tq;
  load_rows(q_s, L.ld, x.q, q0, L.own, x.tq, x.d, x.aligned, [&](int64_t r) { return x.qh.at(b, r, h); });
  load_rows(do_s, L.ld, dout, q0, L.own, x.tq, x.d, x.aligned, [&](int64_t r) { return x.oh.at(b, r, h); });
  dq_w = warp_rows(dq_w, L, ln);
  // δ of this lane's row: its half of dO·O, summed with the other lane's.
  const int d_half = L.nc * kEdge / 2;
  float delta = 0.0f;
  if (active) {
    const int64_t at = x.oh.at(b, row, h);
    for (int c = ln.half * d_half; c < (ln.half + 1) * d_half; ++c) delta += load(dout, at + c) * load(out, at + c);
  }
  delta += __shfl_xor_sync(kAll, delta, 1);
  if (active && ln.half == 0) delta_out[x.lse_at(b, h, row)] = delta;
  const float row_lse = active ? lse[x.lse_at(b, h, row)] : 0.0f;
  const T* q_w = q_s + int64_t(ln.warp) * kEdge * L.ld;
  const T* do_w = do_s + int64_t(ln.warp) * kEdge * L.ld;
  const int cols = L.tile / 2, c0 = ln.half * cols;
  for (int64_t k0 = qb.kv_begin; k0 < qb.kv_end; k0 += L.tile) {
    __syncthreads();
    qb.load_keys(k_s, v_s, x, k0, L);
    __syncthreads();
    scores(s_w, L.ld_s, q_w, k_s, L.tile, L);
    scores(dp_w, L.ld_s, do_w, v_s, L.tile, L);
    __syncwarp();
    for (int c = c0; c < c0 + cols; ++c) {
      const int64_t at = int64_t(ln.r) * L.ld_s + c;
      const float p = active && x.mask.visible(row, k0 + c) ? expf(s_w[at] * scale - row_lse) : 0.0f;
      store(ds_w, int64_t(ln.r) * L.ld_p + c, p * (dp_w[at] - delta));
    }
    __syncwarp();
    accumulate(dq_w, ds_w, L.ld_p, L.tile, k_s, L);
    __syncwarp();
  }
  __syncwarp();
  if (active) store_row(dq, x.qh.at(b, row, h), dq_w, scale, L, ln);
}

// dv_j = Σ_i p_ij dO_i and dk_j = scale · Σ_i p_ij (dO_i·v_j − δ_i) q_i over every query row i that
// sees key j, of every query head reading kv head g (δ from the dq kernel). The warp's scores are
// Sᵀ (its 16 keys by the tile's query rows), so the products are Pᵀ·dO and dSᵀ·Q.
template <class T>
__global__ void attention_tc_dkv_kernel(T* __restrict__ dk, T* __restrict__ dv, const float* __restrict__ delta,
                                        const T* __restrict__ dout, const float* __restrict__ lse, Operands<T> x,
                                        Tiles L, float scale) {
  LT_DYNAMIC_SHARED(unsigned char, smem);
  unsigned char* base = aligned_base(smem);
  T* k_s = reinterpret_cast<T*>(base + L.own_a);
  T* v_s = reinterpret_cast<T*>(base + L.own_b);
  T* q_s = reinterpret_cast<T*>(base + L.tile_a);
  T* do_s = reinterpret_cast<T*>(base + L.tile_b);
  float* lse_s = reinterpret_cast<float*>(base + L.row_a);
  float* delta_s = reinterpret_cast<float*>(base + L.row_b);
  const Lane ln;
  float* dk_w = reinterpret_cast<float*>(base + L.acc_a);
  float* dv_w = reinterpret_cast<float*>(base + L.acc_b);
  float* s_w = reinterpret_cast<float*>(base + L.s_a) + ln.warp * kEdge * L.ld_s;
  float* dp_w = reinterpret_cast<float*>(base + L.s_b) + ln.warp * kEdge * L.ld_s;
  T* p_w = reinterpret_cast<T*>(base + L.p) + ln.warp * kEdge * L.ld_p;
  const int64_t b = blockIdx.z, g = blockIdx.y, k0 = int64_t(blockIdx.x) * L.own;
  const int64_t key = k0 + ln.warp * kEdge + ln.r, per_kv = x.heads / x.kv_heads;
  const bool active = key < x.mask.keys;
  load_rows(k_s, L.ld, x.k, k0, L.own, x.mask.keys, x.d, x.aligned, [&](int64_t r) { return x.kh.at(b, r, g); });
  load_rows(v_s, L.ld, x.v, k0, L.own, x.mask.keys, x.d, x.aligned, [&](int64_t r) { return x.vh.at(b, r, g); });
  dk_w = warp_rows(dk_w, L, ln);
  dv_w = warp_rows(dv_w, L, ln);
  // The query rows that see a key of this block: from the first that sees key k0 (causal) to the
  // last that sees the block's last key (window).
  const int64_t q_begin = x.mask.causal && k0 - x.mask.offset > 0 ? k0 - x.mask.offset : 0;
  int64_t q_end = x.tq;
  if (x.mask.window > 0) {
    const int64_t after = k0 + L.own - 1 - x.mask.offset + x.mask.window;
    q_end = after < q_end ? (after > 0 ? after : 0) : q_end;
  }
  const T* k_w = k_s + int64_t(ln.warp) * kEdge * L.ld;
  const T* v_w = v_s + int64_t(ln.warp) * kEdge * L.ld;
  const int cols = L.tile / 2, c0 = ln.half * cols;
  for (int64_t h = g * per_kv; h < (g + 1) * per_kv; ++h) {
    for (int64_t q0 = q_begin; q0 < q_end; q0 += L.tile) {
      __syncthreads();
      load_rows(q_s, L.ld, x.q, q0, L.tile, x.tq, x.d, x.aligned, [&](int64_t r) { return x.qh.at(b, r, h); });
      load_rows(do_s, L.ld, dout, q0, L.tile, x.tq, x.d, x.aligned, [&](int64_t r) { return x.oh.at(b, r, h); });
      for (int i = int(threadIdx.x); i < L.tile; i += int(blockDim.x)) {
        const int64_t r = q0 + i;
        lse_s[i] = r < x.tq ? lse[x.lse_at(b, h, r)] : 0.0f;
        delta_s[i] = r < x.tq ? delta[x.lse_at(b, h, r)] : 0.0f;
      }
      __syncthreads();
      scores(s_w, L.ld_s, k_w, q_s, L.tile, L);
      __syncwarp();
      for (int c = c0; c < c0 + cols; ++c) {
        const int64_t at = int64_t(ln.r) * L.ld_s + c, r = q0 + c;
        const float p = active && r < x.tq && x.mask.visible(r, key) ? expf(s_w[at] * scale - lse_s[c]) : 0.0f;
        s_w[at] = p;
        store(p_w, int64_t(ln.r) * L.ld_p + c, p);
      }
      __syncwarp();
      accumulate(dv_w, p_w, L.ld_p, L.tile, do_s, L);
      scores(dp_w, L.ld_s, v_w, do_s, L.tile, L);
      __syncwarp();
      for (int c = c0; c < c0 + cols; ++c) {
        const int64_t at = int64_t(ln.r) * L.ld_s + c;
        store(p_w, int64_t(ln.r) * L.ld_p + c, s_w[at] * (dp_w[at] - delta_s[c]));
      }
      __syncwarp();
      accumulate(dk_w, p_w, L.ld_p, L.tile, q_s, L);
      __syncwarp();
    }
  }
  __syncwarp();
  if (!active) return;
  store_row(dk, x.kh.at(b, key, g), dk_w, scale, L, ln);
  store_row(dv, x.vh.at(b, key, g), dv_w, 1.0f, L, ln);
}

unsigned tiles_of(int64_t t, int rows) { return unsigned((t + rows - 1) / rows); }

// Past 48 KiB a kernel's dynamic shared memory needs its attribute set (per device: every launch).
template <class Kernel>
void allow_shared(Kernel* kernel, const Tiles& L) {
  LT_CUDA(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                               int(L.bytes)));
}

}  // namespace

bool attention_tc_takes(const Tensor& q) { return cuda_attention_on_tensor_cores(q.dtype, q.shape[3]); }

void attention_tc_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, Tensor sinks,
                          const AttentionSpec& spec) {
  ProfileScope scope("attention_forward: tensor cores");
  const int64_t b = q.shape[0], tq = q.shape[1], d = q.shape[3];
  const float scale = spec.softmax_scale(d);
  const Tiles L = fit(Kind::forward, d);
  with_storage(q, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, float>) {
      allow_shared(&attention_tc_forward_kernel<T>, L);
      LT_LAUNCH(dim3(tiles_of(tq, L.own), unsigned(spec.heads), unsigned(b)), 32 * L.warps, L.bytes, compute_stream(),
                attention_tc_forward_kernel<T>)
      (data<T>(out), lse.ptr<float>(), with_sinks(operands<T>(q, k, v, spec, {out.data}), sinks), L, scale);
    }
  });
  LT_CUDA_LAUNCHED("attention_tc_forward_kernel");
}

void attention_tc_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                           Tensor lse, const AttentionSpec& spec) {
  ProfileScope scope("attention_backward: tensor cores");
  const int64_t b = q.shape[0], tq = q.shape[1], tk = k.shape[1], d = q.shape[3];
  const float scale = spec.softmax_scale(d);
  float* delta = static_cast<float*>(device_scratch(1, size_t(lse.numel()) * sizeof(float)));
  with_storage(q, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, float>) {
      const Operands<T> x = operands<T>(q, k, v, spec, {dq.data, dk.data, dv.data, dout.data});
      if (tq > 0) {
        const Tiles L = fit(Kind::dq, d);
        allow_shared(&attention_tc_dq_kernel<T>, L);
        LT_LAUNCH(dim3(tiles_of(tq, L.own), unsigned(spec.heads), unsigned(b)), 32 * L.warps, L.bytes, compute_stream(),
                  attention_tc_dq_kernel<T>)
        (data<T>(dq), delta, data<const T>(dout), data<const T>(out), lse.ptr<float>(), x, L, scale);
        LT_CUDA_LAUNCHED("attention_tc_dq_kernel");
      }
      if (tk > 0) {
        const Tiles L = fit(Kind::dkv, d);
        allow_shared(&attention_tc_dkv_kernel<T>, L);
        LT_LAUNCH(dim3(tiles_of(tk, L.own), unsigned(spec.kv_heads), unsigned(b)), 32 * L.warps, L.bytes,
                  compute_stream(), attention_tc_dkv_kernel<T>)
        (data<T>(dk), data<T>(dv), delta, data<const T>(dout), lse.ptr<float>(), x, L, scale);
        LT_CUDA_LAUNCHED("attention_tc_dkv_kernel");
      }
    }
  });
}

}  // namespace llmtrain::kernels::cuda

namespace llmtrain::kernels {

std::string cuda_attention_kernel(DType storage, int64_t head_dim) {
  if (cuda_attention_on_tensor_cores(storage, head_dim)) return "tensor cores (kernels/cuda/attention_tc.cu)";
  return "CUDA cores, fp32 arithmetic (kernels/cuda/attention.cu)";
}

}  // namespace llmtrain::kernels
