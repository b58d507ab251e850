// Causal self-attention with grouped-query heads on the device, flash-attention style
// (kernels/cpu/attention.cpp is the reference; kernels/ops.h has the packed qkv layout): scores are
// never stored. Forward: a block per (query tile, head, sequence), one thread per query row, key
// tiles streamed through shared memory with an online softmax; lse is saved. Backward (flash
// attention 2's split): one kernel per (query tile, head) for dq, one per (key tile, kv head) for dk
// and dv, which walks every query head of its group, so nothing is accumulated across blocks. The
// forward also serves decoding with a KV cache (generation): the same kernel over cache rows.
//
// The rules a reader could get wrong: every thread of a block takes part in every __syncthreads,
// also those whose row lies past the sequence (they load and wait, and compute nothing); the tiles
// live in dynamic shared memory sized by the head dim (at most kMaxHeadDim: 48 KiB, the default
// limit of a launch).
#include "kernels/cuda/storage.cuh"

namespace llmtrain::kernels::cuda {
namespace {

constexpr int kFwdRows = 32, kFwdKeys = 16;  // forward: query rows (threads) and keys per tile
constexpr int kBwdRows = 16, kBwdKeys = 16;  // dq: query rows (threads), keys per tile
constexpr int kKvRows = 16, kKvQueries = 8;  // dk/dv: key rows (threads), queries per tile

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

template <class T>
__global__ void attention_forward_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ qkv,
                                         KvSource<T> kv, Layout lay, float scale) {
  LT_DYNAMIC_SHARED(float, smem);
  const int64_t d = lay.d;
  float* q_s = smem;                  // [kFwdRows][d]
  float* acc_s = q_s + kFwdRows * d;  // [kFwdRows][d]
  float* k_s = acc_s + kFwdRows * d;  // [kFwdKeys][d]
  float* v_s = k_s + kFwdKeys * d;    // [kFwdKeys][d]
  const int64_t b = blockIdx.z, h = blockIdx.y, q0 = int64_t(blockIdx.x) * kFwdRows;
  const int tid = int(threadIdx.x);
  const int64_t row = q0 + tid, g = h / (lay.heads / lay.kv_heads), pos = kv.q_pos0 + row;
  const bool active = row < lay.t;
  if (active)
    for (int64_t e = 0; e < d; ++e) {
      q_s[tid * d + e] = load(qkv, lay.q(b, row, h) + e);
      acc_s[tid * d + e] = 0.0f;
    }
  float m = -INFINITY, l = 0.0f;
  const int64_t last = kv.q_pos0 + q0 + kFwdRows, kv_end = last < kv.len ? last : kv.len;
  const int64_t kv_base = b * kv.batch_stride + g * d;
  for (int64_t k0 = 0; k0 < kv_end; k0 += kFwdKeys) {
    __syncthreads();  // nobody still reads the previous tile
    for (int64_t e = tid; e < kFwdKeys * d; e += blockDim.x) {
      const int64_t key = k0 + e / d, at = kv_base + key * kv.row_stride + e % d;
      k_s[e] = key < kv.len ? load(kv.k, at) : 0.0f;
      v_s[e] = key < kv.len ? load(kv.v, at) : 0.0f;
    }
    __syncthreads();
    if (!active) continue;
    float p[kFwdKeys];
    float tile_max = -INFINITY;
    for (int j = 0; j < kFwdKeys; ++j) {
      const int64_t key = k0 + j;
      p[j] = -INFINITY;
      if (key > pos || key >= kv.len) continue;
      float dot = 0.0f;
      for (int64_t e = 0; e < d; ++e) dot += q_s[tid * d + e] * k_s[j * d + e];
      p[j] = dot * scale;
      tile_max = fmaxf(tile_max, p[j]);
    }
    if (tile_max == -INFINITY) continue;  // no key of this tile is visible to this row
    const float m_new = fmaxf(m, tile_max), correction = expf(m - m_new);
    float sum = 0.0f;
    for (int j = 0; j < kFwdKeys; ++j) {
      p[j] = p[j] == -INFINITY ? 0.0f : expf(p[j] - m_new);
      sum += p[j];
    }
    l = l * correction + sum;
    for (int64_t e = 0; e < d; ++e) {
      float a = acc_s[tid * d + e] * correction;
      for (int j = 0; j < kFwdKeys; ++j) a += p[j] * v_s[j * d + e];
      acc_s[tid * d + e] = a;
    }
    m = m_new;
  }
  if (!active) return;
  const float inv = 1.0f / l;
  for (int64_t e = 0; e < d; ++e) store(out, lay.o(b, row, h) + e, acc_s[tid * d + e] * inv);
  lse[lay.lse(b, h, row)] = m + logf(l);
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
// δ_i = dO_i·O_i.
template <class T>
__global__ void attention_backward_dq_kernel(T* __restrict__ dqkv, const T* __restrict__ dout,
                                             const T* __restrict__ qkv, const T* __restrict__ out,
                                             const float* __restrict__ lse, Layout lay, float scale) {
  LT_DYNAMIC_SHARED(float, smem);
  const int64_t d = lay.d;
  float* q_s = smem;                  // [kBwdRows][d]
  float* do_s = q_s + kBwdRows * d;   // [kBwdRows][d]
  float* dq_s = do_s + kBwdRows * d;  // [kBwdRows][d]
  float* k_s = dq_s + kBwdRows * d;   // [kBwdKeys][d]
  float* v_s = k_s + kBwdKeys * d;    // [kBwdKeys][d]
  const int64_t b = blockIdx.z, h = blockIdx.y, q0 = int64_t(blockIdx.x) * kBwdRows;
  const int tid = int(threadIdx.x);
  const int64_t row = q0 + tid, g = h / (lay.heads / lay.kv_heads);
  const bool active = row < lay.t;
  float delta = 0.0f, row_lse = 0.0f;
  if (active) {
    for (int64_t e = 0; e < d; ++e) {
      q_s[tid * d + e] = load(qkv, lay.q(b, row, h) + e);
      do_s[tid * d + e] = load(dout, lay.o(b, row, h) + e);
      dq_s[tid * d + e] = 0.0f;
      delta += do_s[tid * d + e] * load(out, lay.o(b, row, h) + e);
    }
    row_lse = lse[lay.lse(b, h, row)];
  }
  const int64_t kv_end = q0 + kBwdRows < lay.t ? q0 + kBwdRows : lay.t;
  for (int64_t k0 = 0; k0 < kv_end; k0 += kBwdKeys) {
    __syncthreads();
    for (int64_t e = tid; e < kBwdKeys * d; e += blockDim.x) {
      const int64_t key = k0 + e / d, c = e % d;
      k_s[e] = key < lay.t ? load(qkv, lay.k(b, key, g) + c) : 0.0f;
      v_s[e] = key < lay.t ? load(qkv, lay.v(b, key, g) + c) : 0.0f;
    }
    __syncthreads();
    if (!active) continue;
    for (int j = 0; j < kBwdKeys; ++j) {
      const int64_t key = k0 + j;
      if (key > row || key >= lay.t) continue;
      float s = 0.0f, dp = 0.0f;
      for (int64_t e = 0; e < d; ++e) {
        s += q_s[tid * d + e] * k_s[j * d + e];
        dp += do_s[tid * d + e] * v_s[j * d + e];
      }
      const float p = expf(s * scale - row_lse), ds = p * (dp - delta);
      for (int64_t e = 0; e < d; ++e) dq_s[tid * d + e] += ds * k_s[j * d + e];
    }
  }
  if (!active) return;
  for (int64_t e = 0; e < d; ++e) store(dqkv, lay.q(b, row, h) + e, dq_s[tid * d + e] * scale);
}

// dv_j = Σ_i p_ij dO_i and dk_j = scale · Σ_i p_ij (dO_i·v_j − δ_i) q_i over every query row i >= j
// of every query head reading kv head g.
template <class T>
__global__ void attention_backward_dkv_kernel(T* __restrict__ dqkv, const T* __restrict__ dout,
                                              const T* __restrict__ qkv, const T* __restrict__ out,
                                              const float* __restrict__ lse, Layout lay, float scale) {
  LT_DYNAMIC_SHARED(float, smem);
  const int64_t d = lay.d;
  float* k_s = smem;                     // [kKvRows][d]
  float* v_s = k_s + kKvRows * d;        // [kKvRows][d]
  float* dk_s = v_s + kKvRows * d;       // [kKvRows][d]
  float* dv_s = dk_s + kKvRows * d;      // [kKvRows][d]
  float* q_s = dv_s + kKvRows * d;       // [kKvQueries][d]
  float* do_s = q_s + kKvQueries * d;    // [kKvQueries][d]
  float* lse_s = do_s + kKvQueries * d;  // [kKvQueries]
  float* delta_s = lse_s + kKvQueries;   // [kKvQueries]
  const int64_t b = blockIdx.z, g = blockIdx.y, k0 = int64_t(blockIdx.x) * kKvRows;
  const int tid = int(threadIdx.x);
  const int64_t key = k0 + tid, group = lay.heads / lay.kv_heads;
  const bool active = key < lay.t;
  if (active)
    for (int64_t e = 0; e < d; ++e) {
      k_s[tid * d + e] = load(qkv, lay.k(b, key, g) + e);
      v_s[tid * d + e] = load(qkv, lay.v(b, key, g) + e);
      dk_s[tid * d + e] = 0.0f;
      dv_s[tid * d + e] = 0.0f;
    }
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    for (int64_t q0 = k0; q0 < lay.t; q0 += kKvQueries) {
      __syncthreads();
      for (int64_t e = tid; e < kKvQueries * d; e += blockDim.x) {
        const int64_t row = q0 + e / d, c = e % d;
        q_s[e] = row < lay.t ? load(qkv, lay.q(b, row, h) + c) : 0.0f;
        do_s[e] = row < lay.t ? load(dout, lay.o(b, row, h) + c) : 0.0f;
      }
      if (tid < kKvQueries) {
        const int64_t row = q0 + tid;
        float delta = 0.0f;
        if (row < lay.t)
          for (int64_t e = 0; e < d; ++e) delta += load(dout, lay.o(b, row, h) + e) * load(out, lay.o(b, row, h) + e);
        delta_s[tid] = delta;
        lse_s[tid] = row < lay.t ? lse[lay.lse(b, h, row)] : 0.0f;
      }
      __syncthreads();
      if (!active) continue;
      for (int i = 0; i < kKvQueries; ++i) {
        const int64_t row = q0 + i;
        if (row < key || row >= lay.t) continue;
        float s = 0.0f, dp = 0.0f;
        for (int64_t e = 0; e < d; ++e) {
          s += q_s[i * d + e] * k_s[tid * d + e];
          dp += do_s[i * d + e] * v_s[tid * d + e];
        }
        const float p = expf(s * scale - lse_s[i]), ds = p * (dp - delta_s[i]);
        for (int64_t e = 0; e < d; ++e) {
          dv_s[tid * d + e] += p * do_s[i * d + e];
          dk_s[tid * d + e] += ds * q_s[i * d + e];
        }
      }
    }
  }
  if (!active) return;
  for (int64_t e = 0; e < d; ++e) {
    store(dqkv, lay.k(b, key, g) + e, dk_s[tid * d + e] * scale);
    store(dqkv, lay.v(b, key, g) + e, dv_s[tid * d + e]);
  }
}

unsigned tiles(int64_t t, int rows) { return unsigned((t + rows - 1) / rows); }

}  // namespace

void attention_forward_launch(Storage s, void* out, float* lse, const void* qkv, int64_t b, int64_t t, int64_t heads,
                              int64_t kv_heads, int64_t d) {
  if (b * t == 0) return;
  const Layout lay{t, heads, kv_heads, d};
  const float scale = 1.0f / sqrtf(float(d));
  const size_t smem = size_t(2 * kFwdRows + 2 * kFwdKeys) * size_t(d) * sizeof(float);
  const int64_t width = heads + 2 * kv_heads;
  with_storage(s, [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(qkv);
    const KvSource<T> kv{x + heads * d, x + (heads + kv_heads) * d, t * width * d, width * d, t, 0};
    LT_LAUNCH(dim3(tiles(t, kFwdRows), unsigned(heads), unsigned(b)), kFwdRows, smem, nullptr,
              attention_forward_kernel<T>)
    (static_cast<T*>(out), lse, x, kv, lay, scale);
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
  const size_t smem = size_t(2 * kFwdRows + 2 * kFwdKeys) * size_t(d) * sizeof(float);
  const KvSource<float> kv{k_cache, v_cache, t_max * kv_heads * d, kv_heads * d, position + t, position};
  LT_LAUNCH(dim3(tiles(t, kFwdRows), unsigned(heads), unsigned(b)), kFwdRows, smem, nullptr,
            attention_forward_kernel<float>)
  (out, lse, qkv, kv, lay, scale);
}

void attention_backward_launch(Storage s, void* dqkv, const void* dout, const void* qkv, const void* out,
                               const float* lse, int64_t b, int64_t t, int64_t heads, int64_t kv_heads, int64_t d) {
  if (b * t == 0) return;
  const Layout lay{t, heads, kv_heads, d};
  const float scale = 1.0f / sqrtf(float(d));
  const size_t smem_dq = size_t(3 * kBwdRows + 2 * kBwdKeys) * size_t(d) * sizeof(float);
  const size_t smem_dkv = (size_t(4 * kKvRows + 2 * kKvQueries) * size_t(d) + 2 * kKvQueries) * sizeof(float);
  with_storage(s, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(dim3(tiles(t, kBwdRows), unsigned(heads), unsigned(b)), kBwdRows, smem_dq, nullptr,
              attention_backward_dq_kernel<T>)
    (static_cast<T*>(dqkv), static_cast<const T*>(dout), static_cast<const T*>(qkv), static_cast<const T*>(out), lse,
     lay, scale);
    LT_LAUNCH(dim3(tiles(t, kKvRows), unsigned(kv_heads), unsigned(b)), kKvRows, smem_dkv, nullptr,
              attention_backward_dkv_kernel<T>)
    (static_cast<T*>(dqkv), static_cast<const T*>(dout), static_cast<const T*>(qkv), static_cast<const T*>(out), lse,
     lay, scale);
  });
}

}  // namespace llmtrain::kernels::cuda
