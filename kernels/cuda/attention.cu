// Causal self-attention with grouped-query heads on the device, flash-attention style
// (kernels/cpu/attention.cpp is the reference; kernels/ops.h has the packed qkv layout): scores are
// never stored. Every kernel gives each row (a query row, or a key row for dk/dv) a group of 1, 2
// or 4 consecutive threads, each holding kDims of the head dims in registers (q and the output
// accumulator; dO and dq; k, v, dk and dv), and a block of kThreads threads streams tiles of the
// other side's rows through shared memory; a dot product is each thread's part, summed over its
// group by warp shuffles. Forward: an online softmax over key tiles, lse saved. Backward (flash
// attention 2's split): one kernel per (query tile, head) for dq, which also saves δ = dO·O per row,
// then one per (key tile, kv head) for dk and dv, which walks every query head of its group, so
// nothing is accumulated across blocks. The forward also serves decoding with a KV cache
// (generation): the same kernel over cache rows. Query tiles run last-first: the causal mask makes
// the late ones the longest.
//
// The rules a reader could get wrong: every thread of a block takes part in every __syncthreads
// and every shuffle, also those whose row lies past the sequence (they compute on zeros and store
// nothing); so masked keys are skipped by value (p = 0), never by branching around a shuffle. In
// shared memory each thread's chunk of a row is padded to kChunk floats, so that the 2 or 4 chunks
// a warp reads at once fall in different banks.
#include "kernels/cuda/storage.cuh"

namespace llmtrain::kernels::cuda {
namespace {

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

struct Layout {
  int64_t t, heads, kv_heads, d;
  __device__ int64_t width() const { return heads + 2 * kv_heads; }
  __device__ int64_t q(int64_t b, int64_t row, int64_t h) const { return ((b * t + row) * width() + h) * d; }
  __device__ int64_t k(int64_t b, int64_t row, int64_t g) const { return q(b, row, heads + g); }
  __device__ int64_t v(int64_t b, int64_t row, int64_t g) const { return q(b, row, heads + kv_heads + g); }
  __device__ int64_t o(int64_t b, int64_t row, int64_t h) const { return ((b * t + row) * heads + h) * d; }
  __device__ int64_t lse(int64_t b, int64_t h, int64_t row) const { return (b * heads + h) * t + row; }
};

// Where the forward reads keys and values: the packed qkv itself (training), or the KV cache of
// generation ([b, t_max, kv_heads, d]); kv head g of sequence b, row r at
// base + b·batch_stride + r·row_stride + g·d.
template <class T>
struct KvSource {
  const T* k;
  const T* v;
  int64_t batch_stride, row_stride, len;  // len: keys visible to the last query
  int64_t q_pos0;                         // the position of query row 0 (cache: `position`)
};

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

template <class T>
__global__ void attention_forward_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ qkv,
                                         KvSource<T> kv, Layout lay, float scale, int group) {
  LT_DYNAMIC_SHARED(float, smem);
  float* k_s = smem;                          // [kTile][group][kChunk]
  float* v_s = k_s + kTile * group * kChunk;  // [kTile][group][kChunk]
  const Place pl(group);
  const int64_t b = blockIdx.z, h = blockIdx.y, q0 = int64_t(gridDim.x - 1 - blockIdx.x) * pl.rows();
  const int64_t row = q0 + pl.r, pos = kv.q_pos0 + row, g = h / (lay.heads / lay.kv_heads), d = lay.d;
  const bool active = row < lay.t;
  float q[kDims], acc[kDims];
  load_chunk(q, qkv, lay.q(b, active ? row : 0, h), pl, d, active);
  LT_UNROLL
  for (int e = 0; e < kDims; ++e) acc[e] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  const int64_t last = kv.q_pos0 + q0 + pl.rows(), kv_end = last < kv.len ? last : kv.len;
  const int64_t kv_base = b * kv.batch_stride + g * d;
  for (int64_t k0 = 0; k0 < kv_end; k0 += kTile) {
    __syncthreads();  // nobody still reads the previous tile
    load_tile(k_s, v_s, kv.k, kv.v, k0, kv.len, group, d,
              [&](int64_t key, int) { return kv_base + key * kv.row_stride; });
    __syncthreads();
    float p[kTile];
    float tile_max = -INFINITY;
    LT_UNROLL
    for (int j = 0; j < kTile; ++j) {
      const float dot = group_dot(q, k_s, j, pl);
      const int64_t key = k0 + j;
      p[j] = key <= pos && key < kv.len ? dot * scale : -INFINITY;
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
  if (!active) return;
  store_chunk(out, lay.o(b, row, h), acc, 1.0f / l, pl, d);
  if (pl.c == 0) lse[lay.lse(b, h, row)] = m + logf(l);
}

// The k and v heads of qkv into cache rows [position, position + t).
__global__ void kv_cache_write_kernel(float* __restrict__ k_cache, float* __restrict__ v_cache,
                                      const float* __restrict__ qkv, Layout lay, int64_t t_max, int64_t position) {
  const int64_t width = lay.kv_heads * lay.d;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < lay.t * width;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = blockIdx.y, row = e / width, c = e % width;
    const int64_t at = (b * t_max + position + row) * width + c;
    k_cache[at] = qkv[lay.k(b, row, 0) + c];
    v_cache[at] = qkv[lay.v(b, row, 0) + c];
  }
}

// dq_i = scale · Σ_j p_ij (dO_i·v_j − δ_i) k_j, with p_ij = exp(scale q_i·k_j − lse_i) and
// δ_i = dO_i·O_i, which this kernel also saves for the dk/dv kernel.
template <class T>
__global__ void attention_backward_dq_kernel(T* __restrict__ dqkv, float* __restrict__ delta_out,
                                             const T* __restrict__ dout, const T* __restrict__ qkv,
                                             const T* __restrict__ out, const float* __restrict__ lse, Layout lay,
                                             float scale, int group) {
  LT_DYNAMIC_SHARED(float, smem);
  float* k_s = smem;                          // [kTile][group][kChunk]
  float* v_s = k_s + kTile * group * kChunk;  // [kTile][group][kChunk]
  const Place pl(group);
  const int64_t b = blockIdx.z, h = blockIdx.y, q0 = int64_t(gridDim.x - 1 - blockIdx.x) * pl.rows();
  const int64_t row = q0 + pl.r, g = h / (lay.heads / lay.kv_heads), d = lay.d;
  const bool active = row < lay.t;
  float q[kDims], dO[kDims], dq[kDims];
  load_chunk(q, qkv, lay.q(b, active ? row : 0, h), pl, d, active);
  load_chunk(dO, dout, lay.o(b, active ? row : 0, h), pl, d, active);
  float delta = 0.0f;
  {
    float o[kDims];
    load_chunk(o, out, lay.o(b, active ? row : 0, h), pl, d, active);
    LT_UNROLL
    for (int e = 0; e < kDims; ++e) {
      delta += dO[e] * o[e];
      dq[e] = 0.0f;
    }
    for (int lane_mask = group / 2; lane_mask > 0; lane_mask /= 2) delta += __shfl_xor_sync(kAll, delta, lane_mask);
  }
  if (active && pl.c == 0) delta_out[lay.lse(b, h, row)] = delta;
  const float row_lse = active ? lse[lay.lse(b, h, row)] : 0.0f;
  const int64_t kv_end = q0 + pl.rows() < lay.t ? q0 + pl.rows() : lay.t;
  for (int64_t k0 = 0; k0 < kv_end; k0 += kTile) {
    __syncthreads();
    load_tile(k_s, v_s, qkv, qkv, k0, lay.t, group, d,
              [&](int64_t key, int which) { return which == 0 ? lay.k(b, key, g) : lay.v(b, key, g); });
    __syncthreads();
    for (int j = 0; j < kTile; ++j) {
      const float s = group_dot(q, k_s, j, pl), dp = group_dot(dO, v_s, j, pl);
      const int64_t key = k0 + j;
      const float p = key <= row && key < lay.t ? expf(s * scale - row_lse) : 0.0f;
      add_scaled_row(dq, p * (dp - delta), k_s, j, pl);
    }
  }
  if (!active) return;
  store_chunk(dqkv, lay.q(b, row, h), dq, scale, pl, d);
}

// dv_j = Σ_i p_ij dO_i and dk_j = scale · Σ_i p_ij (dO_i·v_j − δ_i) q_i over every query row i >= j
// of every query head reading kv head g (δ from the dq kernel).
template <class T>
__global__ void attention_backward_dkv_kernel(T* __restrict__ dqkv, const float* __restrict__ delta,
                                              const T* __restrict__ dout, const T* __restrict__ qkv,
                                              const float* __restrict__ lse, Layout lay, float scale, int group) {
  LT_DYNAMIC_SHARED(float, smem);
  float* q_s = smem;                             // [kTile][group][kChunk]
  float* do_s = q_s + kTile * group * kChunk;    // [kTile][group][kChunk]
  float* lse_s = do_s + kTile * group * kChunk;  // [kTile]
  float* delta_s = lse_s + kTile;                // [kTile]
  const Place pl(group);
  const int64_t b = blockIdx.z, g = blockIdx.y, k0 = int64_t(blockIdx.x) * pl.rows();
  const int64_t key = k0 + pl.r, per_kv = lay.heads / lay.kv_heads, d = lay.d;
  const bool active = key < lay.t;
  float k[kDims], v[kDims], dk[kDims], dv[kDims];
  load_chunk(k, qkv, lay.k(b, active ? key : 0, g), pl, d, active);
  load_chunk(v, qkv, lay.v(b, active ? key : 0, g), pl, d, active);
  LT_UNROLL
  for (int e = 0; e < kDims; ++e) dk[e] = dv[e] = 0.0f;
  for (int64_t h = g * per_kv; h < (g + 1) * per_kv; ++h) {
    for (int64_t q0 = k0; q0 < lay.t; q0 += kTile) {
      __syncthreads();
      load_tile(q_s, do_s, qkv, dout, q0, lay.t, group, d,
                [&](int64_t row, int which) { return which == 0 ? lay.q(b, row, h) : lay.o(b, row, h); });
      if (threadIdx.x < kTile) {
        const int64_t row = q0 + threadIdx.x;
        lse_s[threadIdx.x] = row < lay.t ? lse[lay.lse(b, h, row)] : 0.0f;
        delta_s[threadIdx.x] = row < lay.t ? delta[lay.lse(b, h, row)] : 0.0f;
      }
      __syncthreads();
      for (int i = 0; i < kTile; ++i) {
        const float s = group_dot(k, q_s, i, pl), dp = group_dot(v, do_s, i, pl);
        const int64_t row = q0 + i;
        const float p = row >= key && row < lay.t ? expf(s * scale - lse_s[i]) : 0.0f;
        add_scaled_row(dv, p, do_s, i, pl);
        add_scaled_row(dk, p * (dp - delta_s[i]), q_s, i, pl);
      }
    }
  }
  if (!active) return;
  store_chunk(dqkv, lay.k(b, key, g), dk, scale, pl, d);
  store_chunk(dqkv, lay.v(b, key, g), dv, 1.0f, pl, d);
}

unsigned tiles(int64_t t, int rows) { return unsigned((t + rows - 1) / rows); }
size_t tile_bytes(int group) { return size_t(2 * kTile * group * kChunk) * sizeof(float); }

}  // namespace

void attention_forward_launch(Storage s, void* out, float* lse, const void* qkv, int64_t b, int64_t t, int64_t heads,
                              int64_t kv_heads, int64_t d) {
  if (b * t == 0) return;
  const Layout lay{t, heads, kv_heads, d};
  const float scale = 1.0f / sqrtf(float(d));
  const int group = group_for(d);
  const int64_t width = heads + 2 * kv_heads;
  with_storage(s, [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(qkv);
    const KvSource<T> kv{x + heads * d, x + (heads + kv_heads) * d, t * width * d, width * d, t, 0};
    LT_LAUNCH(dim3(tiles(t, kThreads / group), unsigned(heads), unsigned(b)), kThreads, tile_bytes(group), nullptr,
              attention_forward_kernel<T>)
    (static_cast<T*>(out), lse, x, kv, lay, scale, group);
  });
}

void kv_cache_write_launch(float* k_cache, float* v_cache, const float* qkv, int64_t b, int64_t t, int64_t heads,
                           int64_t kv_heads, int64_t d, int64_t t_max, int64_t position) {
  if (b * t == 0) return;
  const Layout lay{t, heads, kv_heads, d};
  LT_LAUNCH(dim3(blocks_for(t * kv_heads * d, 256), unsigned(b)), 256, 0, nullptr, kv_cache_write_kernel)
  (k_cache, v_cache, qkv, lay, t_max, position);
}

void attention_cached_forward_launch(float* out, float* lse, const float* qkv, const float* k_cache,
                                     const float* v_cache, int64_t b, int64_t t, int64_t heads, int64_t kv_heads,
                                     int64_t d, int64_t t_max, int64_t position) {
  if (b * t == 0) return;
  const Layout lay{t, heads, kv_heads, d};
  const float scale = 1.0f / sqrtf(float(d));
  const int group = group_for(d);
  const KvSource<float> kv{k_cache, v_cache, t_max * kv_heads * d, kv_heads * d, position + t, position};
  LT_LAUNCH(dim3(tiles(t, kThreads / group), unsigned(heads), unsigned(b)), kThreads, tile_bytes(group), nullptr,
            attention_forward_kernel<float>)
  (out, lse, qkv, kv, lay, scale, group);
}

void attention_backward_launch(Storage s, void* dqkv, float* delta, const void* dout, const void* qkv, const void* out,
                               const float* lse, int64_t b, int64_t t, int64_t heads, int64_t kv_heads, int64_t d) {
  if (b * t == 0) return;
  const Layout lay{t, heads, kv_heads, d};
  const float scale = 1.0f / sqrtf(float(d));
  const int group = group_for(d);
  with_storage(s, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(dim3(tiles(t, kThreads / group), unsigned(heads), unsigned(b)), kThreads, tile_bytes(group), nullptr,
              attention_backward_dq_kernel<T>)
    (static_cast<T*>(dqkv), delta, static_cast<const T*>(dout), static_cast<const T*>(qkv), static_cast<const T*>(out),
     lse, lay, scale, group);
    LT_LAUNCH(dim3(tiles(t, kThreads / group), unsigned(kv_heads), unsigned(b)), kThreads,
              tile_bytes(group) + 2 * kTile * sizeof(float), nullptr, attention_backward_dkv_kernel<T>)
    (static_cast<T*>(dqkv), delta, static_cast<const T*>(dout), static_cast<const T*>(qkv), lse, lay, scale, group);
  });
}

}  // namespace llmtrain::kernels::cuda
