// Mixture of experts on the device (kernels/cpu/moe.cpp is the reference; kernels/op_table.def has
// the contracts; the per-row maths both run, the router's softmax, top-k and gradient, the stats'
// sums and the plan's keep-and-place rule, is kernels/moe_math.h's). Simple kernels, correct and
// deterministic first:
//  - router: a block per token row; warp w sums the logits of experts w, w + warps, ... by
//    shuffles, then thread 0 takes the softmax and the top-k serially (E is small);
//  - router backward: a thread per row writes dlogits [N, E] into device scratch, then two products;
//  - plan: one block; each thread counts a contiguous chunk of assignments per expert, a thread
//    per expert scans the chunks' counts, thread 0 the offsets, and each thread places its chunk;
//  - stats: one block, a thread per expert summing in double in row order;
//  - gather, combine: elementwise (a warp per assignment for combine's dweight dot products);
//  - the shared expert's gate: a warp per row (its logit's and dlogit's dot products by shuffles),
//    the gate weight's gradient two products like the router's;
//  - grouped product: our tiled GEMM (64×64 tiles of C, 16×16 threads, K through shared memory 16
//    at a time, fp32 accumulation in K order) where each block finds its expert in the offsets;
//    the experts' biases (gpt-oss) an elementwise pass after it, each row finding its expert by
//    binary search in the offsets, and their gradients (and the router bias's) a thread per column
//    summing its expert's rows in row order.
//
// The rule a reader could get wrong: the offsets live on the device and the host never reads them
// (no copy, no synchronisation). A grouped launch therefore covers every split of the rows that
// the offsets could make: ceil(rows / 64) + E + 2 row tiles (each expert adds at most one partial
// tile; the rows before offsets[0] and from offsets[E] on are two more groups, written 0), and a
// block whose tile falls past the last one returns.
#include "kernels/cuda/gemm_tile.cuh"
#include "kernels/moe_math.h"

namespace llmtrain::kernels::cuda {
namespace {

using gemm::kPer;
using gemm::kSide;
using gemm::kTile;

// How a product's blocks find their work: one product, each expert's rows of A and C (with
// B = that expert's slice), or each expert's rows as the depth (C = that expert's slice).
enum class Grouping : int { none, rows, depth };

// A product as the entry points state it: C [m, n] = (accumulate ? C : 0) + op(A)·op(B) with
// every operand dense and row-major: A [m, k] ([k, m] with trans_a), B [k, n] ([n, k] with
// trans_b), C [m, n]. Grouped, the offsets [groups + 1] (on the device) split the rows m among the
// experts (Grouping::rows: B holds an expert's [k, n] after another's) or the depth k
// (Grouping::depth: C holds an expert's [m, n] after another's).
struct Product {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false, accumulate = false;
  Grouping grouping = Grouping::none;
  const int32_t* offsets = nullptr;
  int64_t groups = 0;
};

// What the kernel reads: the product and the strides that follow from it (grouped_gemm sets them).
struct GemmShape : Product {
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t b_stride = 0, c_stride = 0;  // elements between experts' slices of B (rows), of C (depth)
};

__device__ void check_offsets(const int32_t* off, int64_t groups, int64_t rows) {
  LT_DEVICE_CHECK(off[0] >= 0, "expert offsets[0] = %d is negative", off[0]);
  for (int64_t e = 0; e < groups; ++e)
    LT_DEVICE_CHECK(off[e] <= off[e + 1] && off[e + 1] <= rows,
                    "expert offsets[%lld] = %d after offsets[%lld] = %d: offsets must not decrease and stay within "
                    "the %lld rows",
                    (long long)(e + 1), off[e + 1], (long long)e, off[e], (long long)rows);
}

// C = (accumulate ? C : 0) + op(A)·op(B), fp32 arithmetic, one rounding per stored element.
// blockIdx.x: the row tile (over all groups for Grouping::rows), blockIdx.y: the column tile,
// blockIdx.z: the expert (Grouping::depth).
template <class TC, class TA, class TB>
__global__ void grouped_gemm_kernel(TC* c, const TA* __restrict__ a, const TB* __restrict__ b, GemmShape g) {
  const int64_t n0 = int64_t(blockIdx.y) * kTile;
  int64_t m0 = int64_t(blockIdx.x) * kTile, m_end = g.m, k_begin = 0, k_end = g.k;
  bool zero = false;
  if (g.grouping == Grouping::rows) {
    const int32_t* off = g.offsets;
    check_offsets(off, g.groups, g.m);
    // Tiles in order: the rows before offsets[0], each expert's, the rows from offsets[E] on.
    int64_t t = blockIdx.x, found = -2;
    for (int64_t e = -1; e <= g.groups && found == -2; ++e) {
      const int64_t lo = e < 0 ? 0 : off[e], hi = e < 0 ? off[0] : (e == g.groups ? g.m : off[e + 1]);
      const int64_t tiles = (hi - lo + kTile - 1) / kTile;
      if (t < tiles) {
        found = e;
        m0 = lo + t * kTile;
        m_end = hi;
      } else {
        t -= tiles;
      }
    }
    if (found == -2) return;  // past the last tile: the whole block leaves together
    zero = found < 0 || found == g.groups;
    if (!zero) b += found * g.b_stride;
  } else if (g.grouping == Grouping::depth) {
    const int32_t* off = g.offsets;
    check_offsets(off, g.groups, g.k);
    k_begin = off[blockIdx.z];
    k_end = off[blockIdx.z + 1];
    c += int64_t(blockIdx.z) * g.c_stride;
  }
  float acc[kPer][kPer];
  gemm::gemm_zero(acc);
  // Row-major as the linear layer's: A(m, k) = a[m·lda + k] (a[k·lda + m] transposed), B(k, n) = b[k·ldb + n]
  // (b[n·ldb + k]); the rows of this block's group end at m_end.
  if (!zero)
    gemm::gemm_tile(acc, gemm::Operand<TA>{a, g.trans_a ? 1 : g.lda, g.trans_a ? g.lda : 1, m_end}, m0,
                    gemm::Operand<TB>{b, g.trans_b ? g.ldb : 1, g.trans_b ? 1 : g.ldb, g.n}, n0, k_begin, k_end);
  const int64_t m_stop = m0 + kTile < m_end ? m0 + kTile : m_end;
  for (int i = 0; i < kPer; ++i) {
    const int64_t m = m0 + gemm::tile_row(i);
    if (m >= m_stop) continue;
    for (int j = 0; j < kPer; ++j) {
      const int64_t n = n0 + gemm::tile_col(j);
      if (n >= g.n) continue;
      float v = acc[i][j];
      if (g.accumulate) v += load(c, m * g.ldc + n);
      store(c, m * g.ldc + n, v);
    }
  }
}

template <class TC, class TA, class TB>
void grouped_gemm(TC* c, const TA* a, const TB* b, const Product& p) {
  GemmShape g;
  static_cast<Product&>(g) = p;
  g.lda = p.trans_a ? p.m : p.k;
  g.ldb = p.trans_b ? p.k : p.n;
  g.ldc = p.n;
  g.b_stride = p.grouping == Grouping::rows ? p.k * p.n : 0;
  g.c_stride = p.grouping == Grouping::depth ? p.m * p.n : 0;
  if (g.m == 0 || g.n == 0 || (g.grouping == Grouping::depth && g.groups == 0)) return;
  int64_t row_tiles = (g.m + kTile - 1) / kTile;
  if (g.grouping == Grouping::rows) row_tiles += g.groups + 2;
  const dim3 grid(unsigned(row_tiles), unsigned((g.n + kTile - 1) / kTile),
                  unsigned(g.grouping == Grouping::depth ? g.groups : 1));
  LT_LAUNCH(grid, dim3(kSide, kSide), 0, compute_stream(), grouped_gemm_kernel<TC, TA, TB>)(c, a, b, g);
  LT_CUDA_LAUNCHED("grouped_gemm_kernel");
}

// ---- router ------------------------------------------------------------------------------------

constexpr int kRouterThreads = 128;

template <class T>
__global__ void router_forward_kernel(float* __restrict__ probs, float* __restrict__ lse, int32_t* __restrict__ expert,
                                      float* __restrict__ weight, const T* __restrict__ in,
                                      const T* __restrict__ router, const T* __restrict__ bias, int64_t e_count,
                                      int64_t c, int64_t k, bool renormalize) {
  LT_DYNAMIC_SHARED(float, logits);
  const int64_t row = blockIdx.x;
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32), warps = int(blockDim.x / 32);
  const T* x = in + row * c;
  for (int64_t e = warp; e < e_count; e += warps) {
    float s = 0.0f;
    for (int64_t j = lane; j < c; j += 32) s += load(x, j) * load(router, e * c + j);
    s = warp_sum(s);
    if (lane == 0) logits[e] = bias ? s + load(bias, e) : s;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  lse[row] = router_softmax(logits, e_count);
  float* p = probs + row * e_count;
  for (int64_t e = 0; e < e_count; ++e) p[e] = logits[e];
  router_top_k(expert + row * k, weight + row * k, logits, e_count, k, renormalize);
}

// dlogit [N, E], a thread per row.
__global__ void router_dlogit_kernel(float* __restrict__ dlogit, const float* __restrict__ dweight,
                                     const float* __restrict__ probs, const float* __restrict__ lse,
                                     const int32_t* __restrict__ expert, const float* __restrict__ stats, int64_t n,
                                     int64_t e_count, int64_t k, bool renormalize, RouterLossScales scales) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    router_dlogit_row(dlogit + i * e_count, probs + i * e_count, lse[i], expert + i * k, dweight + i * k, stats,
                      e_count, k, renormalize, scales);
}

// ---- biases ------------------------------------------------------------------------------------

// out [rows, cols] += bias[e] on expert e's rows [offsets[e], offsets[e + 1]); a thread per element.
template <class T>
__global__ void grouped_bias_kernel(T* __restrict__ out, const T* __restrict__ bias, const int32_t* __restrict__ off,
                                    int64_t groups, int64_t rows, int64_t cols) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * cols;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / cols;
    if (row < off[0] || row >= off[groups]) continue;
    int64_t lo = 0, hi = groups;  // the last e with off[e] <= row: the expert whose rows hold it
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (off[mid] <= row)
        lo = mid;
      else
        hi = mid;
    }
    store(out, i, load(out, i) + load(bias, lo * cols + i % cols));
  }
}

// sums [groups, cols] += Σ of group g's rows of x [rows, cols] (offsets [groups + 1] on the device,
// or every row as one group when absent), in row order; a thread per (group, column).
template <class TS, class TX>
__global__ void grouped_column_sums_kernel(TS* __restrict__ sums, const TX* __restrict__ x,
                                           const int32_t* __restrict__ off, int64_t groups, int64_t rows,
                                           int64_t cols) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < groups * cols;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t g = i / cols, c = i % cols;
    const int64_t begin = off ? off[g] : 0, end = off ? off[g + 1] : rows;
    float s = 0.0f;
    for (int64_t r = begin; r < end; ++r) s += load(x, r * cols + c);
    store(sums, i, load(sums, i) + s);
  }
}

template <class TS, class TX>
void grouped_column_sums(TS* sums, const TX* x, const int32_t* off, int64_t groups, int64_t rows, int64_t cols) {
  if (groups * cols == 0) return;
  LT_LAUNCH(blocks_for(groups * cols, 128), 128, 0, compute_stream(), grouped_column_sums_kernel<TS, TX>)
  (sums, x, off, groups, rows, cols);
  LT_CUDA_LAUNCHED("grouped_column_sums_kernel");
}

// ---- plan and stats ----------------------------------------------------------------------------

constexpr int kPlanThreads = 256;

// counts [kPlanThreads, E] int32 scratch: thread t's chunk's count of each expert, then the rank
// its chunk starts at within that expert.
__global__ void route_plan_kernel(int32_t* __restrict__ order, int32_t* __restrict__ pos, int32_t* offsets,
                                  const int32_t* __restrict__ expert, int32_t* counts, int64_t m, int64_t e_count,
                                  int64_t capacity) {
  const int64_t t = threadIdx.x, nt = blockDim.x, chunk = (m + nt - 1) / nt;
  const int64_t a0 = t * chunk < m ? t * chunk : m, a1 = a0 + chunk < m ? a0 + chunk : m;
  int32_t* mine = counts + t * e_count;
  for (int64_t e = 0; e < e_count; ++e) mine[e] = 0;
  for (int64_t a = a0; a < a1; ++a) {
    const int32_t e = expert[a];
    LT_DEVICE_CHECK(e >= 0 && e < e_count, "expert id %d at position %lld is outside the experts [0, %lld)", e,
                    (long long)a, (long long)e_count);
    ++mine[e];
  }
  __syncthreads();
  for (int64_t e = t; e < e_count; e += nt) {
    int32_t run = 0;
    for (int64_t q = 0; q < nt; ++q) {
      const int32_t cnt = counts[q * e_count + e];
      counts[q * e_count + e] = run;
      run += cnt;
    }
    offsets[e + 1] = route_kept(run, capacity);  // kept, for now
  }
  __syncthreads();
  if (t == 0) {
    offsets[0] = 0;
    for (int64_t e = 0; e < e_count; ++e) offsets[e + 1] += offsets[e];
  }
  __syncthreads();
  for (int64_t a = a0; a < a1; ++a) {
    const int32_t e = expert[a];
    route_place(order, pos, offsets, e, mine[e]++, a);
  }
  for (int64_t q = offsets[e_count] + t; q < m; q += nt) order[q] = -1;
}

__global__ void route_stats_kernel(float* __restrict__ stats, const float* __restrict__ probs,
                                   const float* __restrict__ lse, const int32_t* __restrict__ expert,
                                   const int32_t* __restrict__ offsets, int64_t n, int64_t e_count, int64_t m) {
  for (int64_t e = threadIdx.x; e < e_count; e += blockDim.x) {
    int64_t cnt = 0;
    for (int64_t a = 0; a < m; ++a) {
      LT_DEVICE_CHECK(expert[a] >= 0 && expert[a] < e_count,
                      "expert id %d at position %lld is outside the experts [0, %lld)", expert[a], (long long)a,
                      (long long)e_count);
      cnt += expert[a] == e;
    }
    stats[e] = float(cnt);
    stats[e_count + e] = route_prob_sum(probs, n, e_count, e);
  }
  if (threadIdx.x == 0) {
    stats[2 * e_count] = route_lse_square_sum(lse, n);
    stats[2 * e_count + 1] = float(m - offsets[e_count]);
  }
}

// ---- gather and combine ------------------------------------------------------------------------

template <class T>
__global__ void gather_forward_kernel(T* __restrict__ out, const T* __restrict__ in, const int32_t* __restrict__ order,
                                      int64_t m, int64_t c, int64_t k, int64_t assignments) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < m * c; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t q = i / c;
    const int32_t a = order[q];
    LT_DEVICE_CHECK(a >= -1 && a < assignments, "moe order %d at row %lld is outside [-1, %lld)", a, (long long)q,
                    (long long)assignments);
    store(out, i, a >= 0 ? load(in, a / k * c + i % c) : 0.0f);
  }
}

template <class T>
__global__ void gather_backward_kernel(T* __restrict__ din, const T* __restrict__ dout, const int32_t* __restrict__ pos,
                                       int64_t n, int64_t c, int64_t k, int64_t m) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n * c; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / c, col = i % c;
    float s = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t q = pos[row * k + j];
      LT_DEVICE_CHECK(q >= -1 && q < m, "moe pos %d at position %lld is outside [-1, %lld)", q,
                      (long long)(row * k + j), (long long)m);
      if (q >= 0) s += load(dout, q * c + col);
    }
    store(din, i, s);
  }
}

template <class T>
__global__ void combine_forward_kernel(T* __restrict__ out, const T* __restrict__ y, const float* __restrict__ weight,
                                       const int32_t* __restrict__ pos, int64_t n, int64_t c, int64_t k, int64_t m) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n * c; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / c, col = i % c;
    float s = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t q = pos[row * k + j];
      LT_DEVICE_CHECK(q >= -1 && q < m, "moe pos %d at position %lld is outside [-1, %lld)", q,
                      (long long)(row * k + j), (long long)m);
      if (q >= 0) s += weight[row * k + j] * load(y, q * c + col);
    }
    store(out, i, s);
  }
}

template <class T>
__global__ void zero_kernel(T* __restrict__ x, int64_t count) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    store(x, i, 0.0f);
}

// A warp per assignment a: dy's row pos[a] and dweight[a] (lanes stride over the channels, the dot
// product summed by shuffles).
template <class T>
__global__ void combine_backward_kernel(T* __restrict__ dy, float* __restrict__ dweight, const T* __restrict__ dout,
                                        const T* __restrict__ y, const float* __restrict__ weight,
                                        const int32_t* __restrict__ pos, int64_t assignments, int64_t c, int64_t k,
                                        int64_t m) {
  const int64_t a = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = int(threadIdx.x % 32);
  if (a >= assignments) return;  // whole warps leave together
  const int32_t q = pos[a];
  LT_DEVICE_CHECK(q >= -1 && q < m, "moe pos %d at position %lld is outside [-1, %lld)", q, (long long)a, (long long)m);
  const T* d = dout + a / k * c;
  float s = 0.0f;
  if (q >= 0) {
    const float w = weight[a];
    for (int64_t j = lane; j < c; j += 32) {
      const float dj = load(d, j);
      store(dy, q * c + j, w * dj);
      s += dj * load(y, q * c + j);
    }
  }
  s = warp_sum(s);
  if (lane == 0) dweight[a] = q >= 0 ? s : 0.0f;
}

// ---- the shared expert's gate ------------------------------------------------------------------

// A warp per row n: the gate's logit by shuffles over the lanes' channels, then out's row.
template <class T>
__global__ void shared_gate_forward_kernel(T* __restrict__ out, float* __restrict__ gate, const T* __restrict__ y,
                                           const T* __restrict__ in, const T* __restrict__ gate_w, int64_t n, int64_t c,
                                           int64_t d) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = int(threadIdx.x % 32);
  if (row >= n) return;  // whole warps leave together
  float s = 0.0f;
  for (int64_t j = lane; j < c; j += 32) s += load(in, row * c + j) * load(gate_w, j);
  const float g = shared_gate_sigmoid(warp_sum(s));
  if (lane == 0) gate[row] = g;
  if (out)
    for (int64_t j = lane; j < d; j += 32) store(out, row * d + j, load(out, row * d + j) + g * load(y, row * d + j));
}

// A warp per row n: dy's row and dlogit[n] (the dot product by shuffles).
template <class T>
__global__ void shared_gate_backward_kernel(T* __restrict__ dy, float* __restrict__ dlogit, const T* __restrict__ dout,
                                            const T* __restrict__ y, const float* __restrict__ gate, int64_t n,
                                            int64_t d) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = int(threadIdx.x % 32);
  if (row >= n) return;
  const float g = gate[row];
  float s = 0.0f;
  for (int64_t j = lane; j < d; j += 32) {
    const float dj = load(dout, row * d + j);
    store(dy, row * d + j, g * dj);
    s += dj * load(y, row * d + j);
  }
  s = warp_sum(s);
  if (lane == 0) dlogit[row] = g * (1.0f - g) * s;
}

}  // namespace

void moe_router_forward(Tensor probs, Tensor lse, Tensor expert, Tensor weight, Tensor in, Tensor router, Tensor bias,
                        int64_t k, bool renormalize) {
  const int64_t e_count = router.shape[0], c = router.shape[1], n = lse.numel();
  if (n == 0) return;
  with_storage(in, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(unsigned(n), kRouterThreads, size_t(e_count) * sizeof(float), compute_stream(), router_forward_kernel<T>)
    (probs.ptr<float>(), lse.ptr<float>(), expert.ptr<int32_t>(), weight.ptr<float>(), data<const T>(in),
     data<const T>(router), bias.defined() ? data<const T>(bias) : nullptr, e_count, c, k, renormalize);
  });
  LT_CUDA_LAUNCHED("router_forward_kernel");
}

void moe_router_backward(Tensor din, Tensor drouter, Tensor dbias, Tensor dweight, Tensor probs, Tensor lse,
                         Tensor expert, Tensor stats, Tensor in, Tensor router, int64_t k, bool renormalize,
                         float aux_coef, float z_coef, float loss_scale) {
  const int64_t e_count = router.shape[0], c = router.shape[1], n = lse.numel();
  if (n == 0) return;
  const RouterLossScales scales = router_loss_scales(e_count, n, k, aux_coef, z_coef, loss_scale);
  float* dlogit = static_cast<float*>(device_scratch(0, size_t(n * e_count) * sizeof(float)));
  LT_LAUNCH(blocks_for(n, 128), 128, 0, compute_stream(), router_dlogit_kernel)
  (dlogit, dweight.ptr<float>(), probs.ptr<float>(), lse.ptr<float>(), expert.ptr<int32_t>(), stats.ptr<float>(), n,
   e_count, k, renormalize, scales);
  LT_CUDA_LAUNCHED("router_dlogit_kernel");
  with_storage(in, [&](auto tag) {
    using T = decltype(tag);
    // din [n, c] += dlogit [n, E] · router [E, c]
    grouped_gemm(data<T>(din), dlogit, data<const T>(router), {.m = n, .n = c, .k = e_count, .accumulate = true});
    // drouter [E, c] += dlogitᵀ [E, n] · in [n, c]
    grouped_gemm(data<T>(drouter), dlogit, data<const T>(in),
                 {.m = e_count, .n = c, .k = n, .trans_a = true, .accumulate = true});
    // dbias [E] += Σ_n dlogit [n, E]
    if (dbias.defined()) grouped_column_sums(data<T>(dbias), dlogit, nullptr, 1, n, e_count);
  });
}

void moe_route_plan(Tensor order, Tensor pos, Tensor offsets, Tensor expert, int64_t experts, int64_t capacity) {
  const int64_t m = expert.numel();
  int32_t* counts = static_cast<int32_t*>(device_scratch(0, size_t(kPlanThreads * experts) * sizeof(int32_t)));
  LT_LAUNCH(1, kPlanThreads, 0, compute_stream(), route_plan_kernel)
  (order.ptr<int32_t>(), pos.ptr<int32_t>(), offsets.ptr<int32_t>(), expert.ptr<int32_t>(), counts, m, experts,
   capacity);
  LT_CUDA_LAUNCHED("route_plan_kernel");
}

void moe_route_stats(Tensor stats, Tensor probs, Tensor lse, Tensor expert, Tensor offsets) {
  const int64_t e_count = probs.shape[1], n = probs.shape[0];
  LT_LAUNCH(1, kPlanThreads, 0, compute_stream(), route_stats_kernel)
  (stats.ptr<float>(), probs.ptr<float>(), lse.ptr<float>(), expert.ptr<int32_t>(), offsets.ptr<int32_t>(), n, e_count,
   expert.numel());
  LT_CUDA_LAUNCHED("route_stats_kernel");
}

void moe_gather_forward(Tensor out, Tensor in, Tensor order, int64_t k) {
  const int64_t c = in.shape[in.shape.rank() - 1], n = c ? in.numel() / c : 0, m = order.numel();
  if (m * c == 0) return;
  with_storage(out, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_for(m * c, 256), 256, 0, compute_stream(), gather_forward_kernel<T>)
    (data<T>(out), data<const T>(in), order.ptr<int32_t>(), m, c, k, n * k);
  });
  LT_CUDA_LAUNCHED("gather_forward_kernel");
}

void moe_gather_backward(Tensor din, Tensor dout, Tensor pos) {
  const int64_t c = din.shape[din.shape.rank() - 1], n = din.numel() / c, k = pos.numel() / n, m = dout.numel() / c;
  with_storage(din, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_for(n * c, 256), 256, 0, compute_stream(), gather_backward_kernel<T>)
    (data<T>(din), data<const T>(dout), pos.ptr<int32_t>(), n, c, k, m);
  });
  LT_CUDA_LAUNCHED("gather_backward_kernel");
}

void moe_combine_forward(Tensor out, Tensor y, Tensor weight, Tensor pos) {
  const int64_t c = out.shape[out.shape.rank() - 1], n = out.numel() / c, k = weight.numel() / n, m = y.numel() / c;
  with_storage(out, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_for(n * c, 256), 256, 0, compute_stream(), combine_forward_kernel<T>)
    (data<T>(out), data<const T>(y), weight.ptr<float>(), pos.ptr<int32_t>(), n, c, k, m);
  });
  LT_CUDA_LAUNCHED("combine_forward_kernel");
}

void moe_combine_backward(Tensor dy, Tensor dweight, Tensor dout, Tensor y, Tensor weight, Tensor pos) {
  const int64_t c = dout.shape[dout.shape.rank() - 1], n = dout.numel() / c, k = weight.numel() / n, m = y.numel() / c,
                assignments = weight.numel();
  with_storage(dy, [&](auto tag) {
    using T = decltype(tag);
    if (m * c > 0) {
      LT_LAUNCH(blocks_for(m * c, 256), 256, 0, compute_stream(), zero_kernel<T>)(data<T>(dy), m * c);
      LT_CUDA_LAUNCHED("zero_kernel (moe_combine_backward)");
    }
    if (assignments > 0) {
      LT_LAUNCH(blocks_of(assignments, 4), 128, 0, compute_stream(), combine_backward_kernel<T>)
      (data<T>(dy), dweight.ptr<float>(), data<const T>(dout), data<const T>(y), weight.ptr<float>(),
       pos.ptr<int32_t>(), assignments, c, k, m);
      LT_CUDA_LAUNCHED("combine_backward_kernel");
    }
  });
}

void moe_shared_gate_forward(Tensor out, Tensor gate, Tensor y, Tensor in, Tensor gate_w) {
  const int64_t n = gate.numel(), c = gate_w.numel(), d = n ? y.numel() / n : 0;
  if (n == 0) return;
  with_storage(in, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_of(n, 4), 128, 0, compute_stream(), shared_gate_forward_kernel<T>)
    (out.defined() ? data<T>(out) : nullptr, gate.ptr<float>(), data<const T>(y), data<const T>(in),
     data<const T>(gate_w), n, c, d);
  });
  LT_CUDA_LAUNCHED("shared_gate_forward_kernel");
}

void moe_shared_gate_backward(Tensor dy, Tensor dlogit, Tensor dout, Tensor y, Tensor gate) {
  const int64_t n = gate.numel(), d = n ? y.numel() / n : 0;
  if (n == 0) return;
  with_storage(dy, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_of(n, 4), 128, 0, compute_stream(), shared_gate_backward_kernel<T>)
    (data<T>(dy), dlogit.ptr<float>(), data<const T>(dout), data<const T>(y), gate.ptr<float>(), n, d);
  });
  LT_CUDA_LAUNCHED("shared_gate_backward_kernel");
}

void moe_shared_gate_weight_backward(Tensor din, Tensor dgate_w, Tensor dlogit, Tensor in, Tensor gate_w) {
  const int64_t n = dlogit.numel(), c = gate_w.numel();
  if (n == 0) return;
  with_storage(in, [&](auto tag) {
    using T = decltype(tag);
    // din [n, c] += dlogit [n, 1] · gate_w [1, c]
    if (din.defined())
      grouped_gemm(data<T>(din), dlogit.ptr<float>(), data<const T>(gate_w),
                   {.m = n, .n = c, .k = 1, .accumulate = true});
    // dgate_w [1, c] += dlogitᵀ [1, n] · in [n, c]
    grouped_gemm(data<T>(dgate_w), dlogit.ptr<float>(), data<const T>(in),
                 {.m = 1, .n = c, .k = n, .trans_a = true, .accumulate = true});
  });
}

void grouped_linear_forward(Tensor out, Tensor in, Tensor weight, Tensor bias, Tensor offsets) {
  const int64_t groups = weight.shape[0], o = weight.shape[1], i_dim = weight.shape[2],
                rows = o ? out.numel() / o : (i_dim ? in.numel() / i_dim : 0);
  const int32_t* off = offsets.ptr<int32_t>();
  with_storage(out, [&](auto tag) {
    using T = decltype(tag);
    // out rows of expert e [r, o] = in [r, i] · weight[e] [o, i]ᵀ
    grouped_gemm(
        data<T>(out), data<const T>(in), data<const T>(weight),
        {.m = rows, .n = o, .k = i_dim, .trans_b = true, .grouping = Grouping::rows, .offsets = off, .groups = groups});
    if (bias.defined() && rows * o > 0) {
      LT_LAUNCH(blocks_for(rows * o, 256), 256, 0, compute_stream(), grouped_bias_kernel<T>)
      (data<T>(out), data<const T>(bias), off, groups, rows, o);
      LT_CUDA_LAUNCHED("grouped_bias_kernel");
    }
  });
}

void grouped_linear_backward(Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in, Tensor weight,
                             Tensor offsets) {
  const int64_t groups = weight.shape[0], o = weight.shape[1], i_dim = weight.shape[2],
                rows = o ? dout.numel() / o : (i_dim ? in.numel() / i_dim : 0);
  const int32_t* off = offsets.ptr<int32_t>();
  with_storage(dweight, [&](auto tag) {
    using T = decltype(tag);
    // din rows of expert e [r, i] = dout [r, o] · weight[e] [o, i]
    if (din.defined())
      grouped_gemm(data<T>(din), data<const T>(dout), data<const T>(weight),
                   {.m = rows, .n = i_dim, .k = o, .grouping = Grouping::rows, .offsets = off, .groups = groups});
    // dweight[e] [o, i] += (its rows of dout)ᵀ [o, r] · its rows of in [r, i]
    grouped_gemm(data<T>(dweight), data<const T>(dout), data<const T>(in),
                 {.m = o,
                  .n = i_dim,
                  .k = rows,
                  .trans_a = true,
                  .accumulate = true,
                  .grouping = Grouping::depth,
                  .offsets = off,
                  .groups = groups});
    // dbias[e] [o] += Σ its rows of dout
    if (dbias.defined()) grouped_column_sums(data<T>(dbias), data<const T>(dout), off, groups, rows, o);
  });
}

}  // namespace llmtrain::kernels::cuda
