// Attention of a block of queries over a block of keys and values, with grouped-query heads, on the
// device, flash-attention style (kernels/cpu/attention.cpp is the reference; kernels/op_table.def
// and kernels/ops.h's AttentionSpec have the contract): scores are never stored. q, k and v are
// heads inside [B, T, width, D] tensors (Heads), so the packed training layout, a KV cache and a
// block received from another rank are all one kernel's input. Every kernel gives each row (a
// query row, or a key row for dk/dv) a group of 1, 2 or 4 consecutive threads, each holding kDims
// of the head dims in registers (q and the output accumulator; dO and dq; k, v, dk and dv), and a
// block of kThreads threads streams tiles of the other side's rows through shared memory; a dot
// product is each thread's part, summed over its group by warp shuffles. Forward: an online
// softmax over the key tiles the block's rows see (Mask: causal, a sliding window, or every key),
// lse saved. Backward (flash attention 2's split): one kernel per (query tile, head) for dq, which
// also saves δ = dO·O per row, then one per (key tile, kv head) for dk and dv, which walks every
// query head of its group over the query rows that see its keys, so nothing is accumulated across
// blocks. attention_merge joins two partial results by their lse. Query tiles run last-first: the
// causal mask makes the late ones the longest. Attention sinks (gpt-oss) join in each forward
// kernel's epilogue (finish_row: one more key of the sink's logit and value 0, so a 16-bit output is
// rounded once); their gradient is one block per head summing
// its rows in a fixed order (attention_sink_grads_kernel), and the dq/dk/dv kernels need nothing more:
// their probabilities come from the final lse, which holds the sinks.
//
// The rules a reader could get wrong: every thread of a block takes part in every __syncthreads
// and every shuffle, also those whose row lies past the sequence (they compute on zeros and store
// nothing); so masked keys are skipped by value (p = 0), never by branching around a shuffle. A
// row that sees no key stores out = 0 and lse = -inf. In shared memory each thread's chunk of a
// row is padded to kChunk floats, so that the 2 or 4 chunks a warp reads at once fall in different
// banks.
#include <string>

#include "kernels/cuda/attention_operands.cuh"
#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/storage.cuh"

namespace llmtrain::kernels::cuda {
namespace {

using attention::Heads;
using attention::Mask;
using attention::operands;
using attention::Operands;

// The largest head dim: the tiles' shared memory and a row's 4 threads of kDims each.
constexpr int64_t kMaxHeadDim = 128;

constexpr int kThreads = 128;      // threads per block, every kernel
constexpr int kDims = 32;          // head dims per thread
constexpr int kChunk = kDims + 4;  // floats per chunk in shared memory (padded)
constexpr int kTile = 32;          // rows of the streamed side per shared-memory tile
constexpr unsigned kAll = 0xffffffffu;

// Threads per row: the power of two that covers d with kDims each (1, 2 or 4 for d <= 128).
int group_for(int64_t d) {
  int g = 1;
  while (int64_t(g) * kDims < d) g *= 2;
  return g;
}

// This thread's place: row r of the block's rows, chunk c of the row (dims [c·kDims, +kDims)).
struct Place {
  int group, c, r;
  __device__ explicit Place(int g) : group(g), c(int(threadIdx.x) % g), r(int(threadIdx.x) / g) {}
  __device__ int rows() const { return kThreads / group; }
  __device__ int64_t dim0() const { return int64_t(c) * kDims; }
};

// x[0, kDims) = the chunk of src's row at `at` (dims past d are zero; nothing read when !valid).
template <class T>
__device__ void load_chunk(float* x, const T* src, int64_t at, const Place& p, int64_t d, bool valid) {
  LT_UNROLL
  for (int e = 0; e < kDims; ++e) x[e] = valid && p.dim0() + e < d ? load(src, at + p.dim0() + e) : 0.0f;
}

template <class T>
__device__ void store_chunk(T* dst, int64_t at, const float* x, float factor, const Place& p, int64_t d) {
  LT_UNROLL
  for (int e = 0; e < kDims; ++e)
    if (p.dim0() + e < d) store(dst, at + p.dim0() + e, x[e] * factor);
}

// A tile of `rows` rows from two sources into shared memory, padded chunks, zeros past d and past
// the valid rows. Row j of the tile is source row first + j, at a_at(row) / b_at(row).
template <class T, class At>
__device__ void load_tile(float* a_s, float* b_s, const T* a, const T* b, int64_t first, int64_t valid_end, int group,
                          int64_t d, At at) {
  const int per_row = group * kDims;
  for (int e = int(threadIdx.x); e < kTile * per_row; e += kThreads) {
    const int j = e / per_row, dim = e % per_row;
    const int64_t row = first + j;
    const bool ok = row < valid_end && dim < d;
    const int s = (j * group + dim / kDims) * kChunk + dim % kDims;
    a_s[s] = ok ? load(a, at(row, 0) + dim) : 0.0f;
    b_s[s] = ok ? load(b, at(row, 1) + dim) : 0.0f;
  }
}

// The dot product of this thread's chunk x with its chunk of tile row j, summed over the group.
__device__ __forceinline__ float group_dot(const float* x, const float* tile, int j, const Place& p) {
  const float* y = tile + (j * p.group + p.c) * kChunk;
  float s = 0.0f;
  LT_UNROLL
  for (int e = 0; e < kDims; ++e) s += x[e] * y[e];
  for (int lane_mask = p.group / 2; lane_mask > 0; lane_mask /= 2) s += __shfl_xor_sync(kAll, s, lane_mask);
  return s;
}

__device__ __forceinline__ void add_scaled_row(float* acc, float a, const float* tile, int j, const Place& p) {
  const float* y = tile + (j * p.group + p.c) * kChunk;
  LT_UNROLL
  for (int e = 0; e < kDims; ++e) acc[e] += a * y[e];
}

// The forward's and the dq kernel's view of their block: (query tile, head, sequence), tiles
// last-first; this thread's query row, its kv head, and the key rows the tile's active rows see.
struct QueryTile {
  int64_t b, h, q0, row, g, kv_begin, kv_end;
  bool active;
  template <class T>
  __device__ QueryTile(const Operands<T>& x, const Place& pl)
      : b(blockIdx.z),
        h(blockIdx.y),
        q0(int64_t(gridDim.x - 1 - blockIdx.x) * pl.rows()),
        row(q0 + pl.r),
        g(h / (x.heads / x.kv_heads)),
        kv_begin(x.mask.lo(q0)),
        kv_end(x.mask.hi((q0 + pl.rows() < x.tq ? q0 + pl.rows() : x.tq) - 1)),
        active(row < x.tq) {}
  // Key rows [k0, k0 + kTile) of kv head g into k_s and v_s.
  template <class T>
  __device__ void load_keys(float* k_s, float* v_s, const Operands<T>& x, int64_t k0, int group) const {
    load_tile(k_s, v_s, x.k, x.v, k0, x.mask.keys, group, x.d,
              [&](int64_t key, int which) { return which == 0 ? x.kh.at(b, key, g) : x.vh.at(b, key, g); });
  }
};

template <class T>
__global__ void attention_forward_kernel(T* __restrict__ out, float* __restrict__ lse, Operands<T> x, float scale,
                                         int group) {
  LT_DYNAMIC_SHARED(float, smem);
  float* k_s = smem;                          // [kTile][group][kChunk]
  float* v_s = k_s + kTile * group * kChunk;  // [kTile][group][kChunk]
  const Place pl(group);
  const QueryTile qt(x, pl);
  const int64_t row = qt.row, d = x.d;
  float q[kDims], acc[kDims];
  load_chunk(q, x.q, x.qh.at(qt.b, qt.active ? row : 0, qt.h), pl, d, qt.active);
  LT_UNROLL
  for (int e = 0; e < kDims; ++e) acc[e] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int64_t k0 = qt.kv_begin; k0 < qt.kv_end; k0 += kTile) {
    __syncthreads();  // nobody still reads the previous tile
    qt.load_keys(k_s, v_s, x, k0, group);
    __syncthreads();
    float p[kTile];
    float tile_max = -INFINITY;
    LT_UNROLL
    for (int j = 0; j < kTile; ++j) {
      const float dot = group_dot(q, k_s, j, pl);
      p[j] = x.mask.visible(row, k0 + j) ? dot * scale : -INFINITY;
      tile_max = fmaxf(tile_max, p[j]);
    }
    if (tile_max == -INFINITY) continue;  // no key of this tile is visible to this row
    const float m_new = fmaxf(m, tile_max), correction = expf(m - m_new);
    float sum = 0.0f;
    LT_UNROLL
    for (int j = 0; j < kTile; ++j) {
      p[j] = p[j] == -INFINITY ? 0.0f : expf(p[j] - m_new);
      sum += p[j];
    }
    l = l * correction + sum;
    LT_UNROLL
    for (int e = 0; e < kDims; ++e) acc[e] *= correction;
    LT_UNROLL
    for (int j = 0; j < kTile; ++j) add_scaled_row(acc, p[j], v_s, j, pl);
    m = m_new;
  }
  if (!qt.active) return;
  // A row that saw no key: out = 0, lse = -inf (m is -inf and l is 0 then), or the sink's.
  float factor, row_lse;
  finish_row(x, qt.h, m, l, factor, row_lse);
  store_chunk(out, x.oh.at(qt.b, row, qt.h), acc, factor, pl, d);
  if (pl.c == 0) lse[x.lse_at(qt.b, qt.h, row)] = row_lse;
}

// The k and v heads of qkv [b, t, heads + 2·kv_heads, d] into cache rows [position, position + t).
__global__ void kv_cache_write_kernel(float* __restrict__ k_cache, float* __restrict__ v_cache,
                                      const float* __restrict__ qkv, int64_t t, int64_t heads, int64_t kv_heads,
                                      int64_t d, int64_t t_max, int64_t position) {
  const int64_t width = kv_heads * d, row_width = (heads + 2 * kv_heads) * d;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < t * width;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = blockIdx.y, row = e / width, c = e % width;
    const int64_t at = (b * t_max + position + row) * width + c, src = (b * t + row) * row_width + heads * d + c;
    k_cache[at] = qkv[src];
    v_cache[at] = qkv[src + width];
  }
}

// dq_i = scale · Σ_j p_ij (dO_i·v_j − δ_i) k_j, with p_ij = exp(scale q_i·k_j − lse_i) and
// δ_i = dO_i·O_i, which this kernel also saves for the dk/dv kernel.
template <class T>
__global__ void attention_backward_dq_kernel(T* __restrict__ dq, float* __restrict__ delta_out,
                                             const T* __restrict__ dout, const T* __restrict__ out,
                                             const float* __restrict__ lse, Operands<T> x, float scale, int group) {
  LT_DYNAMIC_SHARED(float, smem);
  float* k_s = smem;                          // [kTile][group][kChunk]
  float* v_s = k_s + kTile * group * kChunk;  // [kTile][group][kChunk]
  const Place pl(group);
  const QueryTile qt(x, pl);
  const int64_t b = qt.b, h = qt.h, row = qt.row, d = x.d;
  const bool active = qt.active;
  float q[kDims], dO[kDims], dqr[kDims];
  load_chunk(q, x.q, x.qh.at(b, active ? row : 0, h), pl, d, active);
  load_chunk(dO, dout, x.oh.at(b, active ? row : 0, h), pl, d, active);
  float delta = 0.0f;
  {
    float o[kDims];
    load_chunk(o, out, x.oh.at(b, active ? row : 0, h), pl, d, active);
    LT_UNROLL
    for (int e = 0; e < kDims; ++e) {
      delta += dO[e] * o[e];
      dqr[e] = 0.0f;
    }
    for (int lane_mask = group / 2; lane_mask > 0; lane_mask /= 2) delta += __shfl_xor_sync(kAll, delta, lane_mask);
  }
  if (active && pl.c == 0) delta_out[x.lse_at(b, h, row)] = delta;
  const float row_lse = active ? lse[x.lse_at(b, h, row)] : 0.0f;
  for (int64_t k0 = qt.kv_begin; k0 < qt.kv_end; k0 += kTile) {
    __syncthreads();
    qt.load_keys(k_s, v_s, x, k0, group);
    __syncthreads();
    for (int j = 0; j < kTile; ++j) {
      const float s = group_dot(q, k_s, j, pl), dp = group_dot(dO, v_s, j, pl);
      const float p = active && x.mask.visible(row, k0 + j) ? expf(s * scale - row_lse) : 0.0f;
      add_scaled_row(dqr, p * (dp - delta), k_s, j, pl);
    }
  }
  if (!active) return;
  store_chunk(dq, x.qh.at(b, row, h), dqr, scale, pl, d);
}

// dv_j = Σ_i p_ij dO_i and dk_j = scale · Σ_i p_ij (dO_i·v_j − δ_i) q_i over every query row i that
// sees key j, of every query head reading kv head g (δ from the dq kernel).
template <class T>
__global__ void attention_backward_dkv_kernel(T* __restrict__ dk, T* __restrict__ dv, const float* __restrict__ delta,
                                              const T* __restrict__ dout, const float* __restrict__ lse, Operands<T> x,
                                              float scale, int group) {
  LT_DYNAMIC_SHARED(float, smem);
  float* q_s = smem;                             // [kTile][group][kChunk]
  float* do_s = q_s + kTile * group * kChunk;    // [kTile][group][kChunk]
  float* lse_s = do_s + kTile * group * kChunk;  // [kTile]
  float* delta_s = lse_s + kTile;                // [kTile]
  const Place pl(group);
  const int64_t b = blockIdx.z, g = blockIdx.y, k0 = int64_t(blockIdx.x) * pl.rows();
  const int64_t key = k0 + pl.r, per_kv = x.heads / x.kv_heads, d = x.d;
  const bool active = key < x.mask.keys;
  float k[kDims], v[kDims], dkr[kDims], dvr[kDims];
  load_chunk(k, x.k, x.kh.at(b, active ? key : 0, g), pl, d, active);
  load_chunk(v, x.v, x.vh.at(b, active ? key : 0, g), pl, d, active);
  LT_UNROLL
  for (int e = 0; e < kDims; ++e) dkr[e] = dvr[e] = 0.0f;
  // The query rows that see a key of this block: from the first that sees key k0 (causal) to the
  // last that sees the block's last key (window).
  const int64_t q_begin = x.mask.causal && k0 - x.mask.offset > 0 ? k0 - x.mask.offset : 0;
  int64_t q_end = x.tq;
  if (x.mask.window > 0) {
    const int64_t after = k0 + pl.rows() - 1 - x.mask.offset + x.mask.window;
    q_end = after < q_end ? (after > 0 ? after : 0) : q_end;
  }
  for (int64_t h = g * per_kv; h < (g + 1) * per_kv; ++h) {
    for (int64_t q0 = q_begin; q0 < q_end; q0 += kTile) {
      __syncthreads();
      load_tile(q_s, do_s, x.q, dout, q0, x.tq, group, d,
                [&](int64_t row, int which) { return which == 0 ? x.qh.at(b, row, h) : x.oh.at(b, row, h); });
      if (threadIdx.x < kTile) {
        const int64_t row = q0 + threadIdx.x;
        lse_s[threadIdx.x] = row < x.tq ? lse[x.lse_at(b, h, row)] : 0.0f;
        delta_s[threadIdx.x] = row < x.tq ? delta[x.lse_at(b, h, row)] : 0.0f;
      }
      __syncthreads();
      for (int i = 0; i < kTile; ++i) {
        const float s = group_dot(k, q_s, i, pl), dp = group_dot(v, do_s, i, pl);
        const int64_t row = q0 + i;
        const float p = row < x.tq && active && x.mask.visible(row, key) ? expf(s * scale - lse_s[i]) : 0.0f;
        add_scaled_row(dvr, p, do_s, i, pl);
        add_scaled_row(dkr, p * (dp - delta_s[i]), q_s, i, pl);
      }
    }
  }
  if (!active) return;
  store_chunk(dk, x.kh.at(b, key, g), dkr, scale, pl, d);
  store_chunk(dv, x.vh.at(b, key, g), dvr, 1.0f, pl, d);
}

// Merging a second partial result into (out, lse): the output rows (reading both lse), then the
// lse entries (a second kernel, so that no thread reads an lse another has already replaced).
template <class T>
__global__ void attention_merge_out_kernel(T* out, const T* __restrict__ out_b, const float* __restrict__ lse,
                                           const float* __restrict__ lse_b, int64_t t, int64_t heads, int64_t d,
                                           int64_t total) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = e / d, b = row / (t * heads), i = row / heads % t, h = row % heads;
    const float la = lse[(b * heads + h) * t + i], lb = lse_b[(b * heads + h) * t + i];
    if (lb == -INFINITY) continue;
    if (la == -INFINITY) {
      store(out, e, load(out_b, e));
      continue;
    }
    const float m = fmaxf(la, lb), wa = expf(la - m), wb = expf(lb - m), sum = wa + wb;
    store(out, e, load(out, e) * (wa / sum) + load(out_b, e) * (wb / sum));
  }
}

__global__ void attention_merge_lse_kernel(float* lse, const float* __restrict__ lse_b, int64_t n) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const float la = lse[e], lb = lse_b[e];
    if (lb == -INFINITY) continue;
    if (la == -INFINITY) {
      lse[e] = lb;
      continue;
    }
    const float m = fmaxf(la, lb);
    lse[e] = m + logf(expf(la - m) + expf(lb - m));
  }
}

// dsinks[h] −= Σ over head h's rows of e^(sinks[h] − lse)·(dout · out): one block per head, its
// threads over the rows in a fixed stride, then a fixed tree (the same sum every run).
constexpr int kSinkThreads = 256;
template <class T>
__global__ void attention_sink_grads_kernel(T* dsinks, const T* __restrict__ sinks, const T* __restrict__ out,
                                            const T* __restrict__ dout, const float* __restrict__ lse, int64_t b,
                                            int64_t t, int64_t heads, int64_t d) {
  __shared__ float part[kSinkThreads];
  const int64_t h = blockIdx.x;
  const float sink = load(sinks, h);
  float acc = 0.0f;
  for (int64_t r = threadIdx.x; r < b * t; r += kSinkThreads) {
    const int64_t s = r / t, i = r % t, o = ((s * t + i) * heads + h) * d;
    float delta = 0.0f;
    for (int64_t c = 0; c < d; ++c) delta += load(out, o + c) * load(dout, o + c);
    acc += expf(sink - lse[(s * heads + h) * t + i]) * delta;
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int half = kSinkThreads / 2; half > 0; half /= 2) {
    if (int(threadIdx.x) < half) part[threadIdx.x] += part[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) store(dsinks, h, load(dsinks, h) - part[0]);
}

// The sizes come from q: the contract holds out to its element count only (any shape of B·Tq·heads·D).
void sink_grads(Tensor dsinks, Tensor sinks, Tensor out, Tensor dout, Tensor lse, const Tensor& q,
                const AttentionSpec& spec) {
  const int64_t b = q.shape[0], t = q.shape[1], d = q.shape[3];
  with_storage(out, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(unsigned(spec.heads), kSinkThreads, 0, compute_stream(), attention_sink_grads_kernel<T>)
    (data<T>(dsinks), data<const T>(sinks), data<const T>(out), data<const T>(dout), lse.ptr<float>(), b, t, spec.heads,
     d);
  });
  LT_CUDA_LAUNCHED("attention_sink_grads_kernel");
}

unsigned tiles(int64_t t, int rows) { return unsigned((t + rows - 1) / rows); }
size_t tile_bytes(int group) { return size_t(2 * kTile * group * kChunk) * sizeof(float); }

void check_head_dim(int64_t d) {
  if (d > kMaxHeadDim)
    not_supported("attention with head dim " + std::to_string(d) +
                      " on CUDA in fp32 storage, or not a multiple of 16 "
                      "(these kernels take up to " +
                      std::to_string(kMaxHeadDim) +
                      "; the tensor-core ones, bf16 and fp16 "
                      "at multiples of 16, up to 256)",
                  "use a model whose head dim (model.hidden / model.heads) is at most 128, or train.precision: bf16 "
                  "with a multiple of 16 up to 256, or train.device: cpu");
}

}  // namespace

void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, Tensor sinks, const AttentionSpec& spec) {
  const int64_t b = q.shape[0], tq = q.shape[1], d = q.shape[3];
  if (b * tq == 0) return;
  if (attention_tc_takes(q)) return attention_tc_forward(out, lse, q, k, v, sinks, spec);
  check_head_dim(d);
  const float scale = spec.softmax_scale(d);
  const int group = group_for(d);
  with_storage(q, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(dim3(tiles(tq, kThreads / group), unsigned(spec.heads), unsigned(b)), kThreads, tile_bytes(group),
              compute_stream(), attention_forward_kernel<T>)
    (data<T>(out), lse.ptr<float>(), with_sinks(operands<T>(q, k, v, spec), sinks), scale, group);
  });
  LT_CUDA_LAUNCHED("attention_forward_kernel");
}

void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dsinks, Tensor dout, Tensor q, Tensor k, Tensor v,
                        Tensor out, Tensor lse, Tensor sinks, const AttentionSpec& spec) {
  const int64_t b = q.shape[0], tq = q.shape[1], tk = k.shape[1], d = q.shape[3];
  if (b * (tq + tk) == 0) return;
  if (dsinks.defined() && tq > 0) sink_grads(dsinks, sinks, out, dout, lse, q, spec);
  if (attention_tc_takes(q)) return attention_tc_backward(dq, dk, dv, dout, q, k, v, out, lse, spec);
  check_head_dim(d);
  const float scale = spec.softmax_scale(d);
  const int group = group_for(d);
  // δ = dO·O per query row, from the dq kernel to the dk/dv kernel.
  float* delta = static_cast<float*>(device_scratch(1, size_t(lse.numel()) * sizeof(float)));
  with_storage(q, [&](auto tag) {
    using T = decltype(tag);
    const Operands<T> x = operands<T>(q, k, v, spec);
    if (tq > 0) {
      LT_LAUNCH(dim3(tiles(tq, kThreads / group), unsigned(spec.heads), unsigned(b)), kThreads, tile_bytes(group),
                compute_stream(), attention_backward_dq_kernel<T>)
      (data<T>(dq), delta, data<const T>(dout), data<const T>(out), lse.ptr<float>(), x, scale, group);
      LT_CUDA_LAUNCHED("attention_backward_dq_kernel");
    }
    if (tk > 0) {
      LT_LAUNCH(dim3(tiles(tk, kThreads / group), unsigned(spec.kv_heads), unsigned(b)), kThreads,
                tile_bytes(group) + 2 * kTile * sizeof(float), compute_stream(), attention_backward_dkv_kernel<T>)
      (data<T>(dk), data<T>(dv), delta, data<const T>(dout), lse.ptr<float>(), x, scale, group);
      LT_CUDA_LAUNCHED("attention_backward_dkv_kernel");
    }
  });
}

void attention_merge(Tensor out, Tensor lse, Tensor out_b, Tensor lse_b) {
  const int64_t t = out.shape[1], heads = out.shape[2], d = out.shape[3], total = out.numel();
  if (total == 0) return;
  with_storage(out, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_for(total, 256), 256, 0, compute_stream(), attention_merge_out_kernel<T>)
    (data<T>(out), data<const T>(out_b), lse.ptr<float>(), lse_b.ptr<float>(), t, heads, d, total);
  });
  LT_CUDA_LAUNCHED("attention_merge_out_kernel");
  LT_LAUNCH(blocks_for(lse.numel(), 256), 256, 0, compute_stream(), attention_merge_lse_kernel)
  (lse.ptr<float>(), lse_b.ptr<float>(), lse.numel());
  LT_CUDA_LAUNCHED("attention_merge_lse_kernel");
}

void kv_cache_write(Tensor k_cache, Tensor v_cache, Tensor qkv, int64_t heads, int64_t kv_heads, int64_t position) {
  const int64_t b = qkv.shape[0], t = qkv.shape[1], d = qkv.shape[3];
  if (b * t == 0) return;
  LT_LAUNCH(dim3(blocks_for(t * kv_heads * d, 256), unsigned(b)), 256, 0, compute_stream(), kv_cache_write_kernel)
  (k_cache.ptr<float>(), v_cache.ptr<float>(), qkv.ptr<float>(), t, heads, kv_heads, d, k_cache.shape[1], position);
  LT_CUDA_LAUNCHED("kv_cache_write_kernel");
}

}  // namespace llmtrain::kernels::cuda
