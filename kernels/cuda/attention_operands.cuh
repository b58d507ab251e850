// What the attention kernels of kernels/cuda/attention.cu (the CUDA cores) and attention_tc.cu (the
// tensor cores) share: where a head's row lies inside its [B, T, width, D] tensor, which keys a
// query row sees, and one call's tensors and shapes, made from the op's arguments (kernels/ops.h's
// AttentionSpec, kernels/op_table.def's contract).
#pragma once

#include <cstdint>
#include <initializer_list>

#include "kernels/cuda/storage.cuh"

namespace llmtrain::kernels::cuda::attention {

// The heads of one of q, k, v, out (or a gradient) inside its [B, T, width, D] tensor: element e of
// head h (counted from `first`) of row `row` of sequence b is at at(b, row, h) + e.
struct Heads {
  int64_t t, width, first, d;
  __device__ int64_t at(int64_t b, int64_t row, int64_t h) const { return ((b * t + row) * width + first + h) * d; }
};

// Which keys a query row sees (kernels/ops.h's AttentionSpec in key-row coordinates): key rows
// [lo(row), hi(row)).
struct Mask {
  int64_t offset;  // q_begin − kv_begin
  int64_t keys;    // key rows
  bool causal;
  int64_t window;
  __device__ int64_t hi(int64_t row) const {
    if (!causal) return keys;
    const int64_t h = offset + row + 1;
    return h < 0 ? 0 : (h < keys ? h : keys);
  }
  __device__ int64_t lo(int64_t row) const {
    if (window <= 0) return 0;
    const int64_t l = offset + row + 1 - window;
    return l < 0 ? 0 : (l < keys ? l : keys);
  }
  __device__ bool visible(int64_t row, int64_t key) const { return key >= lo(row) && key < hi(row); }
};

// One attention call's tensors and shapes.
template <class T>
struct Operands {
  const T *q, *k, *v;
  Heads qh, kh, vh, oh;  // oh: out and dout [B, Tq, heads, D]
  int64_t tq, heads, kv_heads, d;
  Mask mask;
  bool aligned;              // q, k, v and `others` all 16-byte aligned (rows of 16-bit elements move as vectors)
  const T* sinks = nullptr;  // [heads] attention sinks (gpt-oss), or none
  __device__ int64_t lse_at(int64_t b, int64_t h, int64_t row) const { return (b * heads + h) * tq + row; }
};

// The end of query row's online softmax over the keys (running maximum m, sum l of e^(s − m)): the
// factor its output accumulator is scaled by and its lse, the sink of head h joined (one more key
// of that logit and value 0) when there are sinks. A row that saw nothing: factor 0, lse -inf (or
// the sink).
template <class T>
__device__ inline void finish_row(const Operands<T>& x, int64_t h, float m, float l, float& factor, float& lse) {
  if (!x.sinks) {
    factor = l > 0.0f ? 1.0f / l : 0.0f;
    lse = l > 0.0f ? m + logf(l) : -INFINITY;
    return;
  }
  const float sink = load(x.sinks, h), top = fmaxf(m, sink), kept = l > 0.0f ? expf(m - top) : 0.0f;
  const float total = l * kept + expf(sink - top);
  factor = kept / total;
  lse = top + logf(total);
}

// The operands of attention over q, k and v by `spec`; `others` are the call's other tensors' data
// (out, gradients), which `aligned` also covers.
template <class T>
Operands<T> operands(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionSpec& spec,
                     std::initializer_list<const void*> others = {}) {
  const int64_t tq = q.shape[1], d = q.shape[3];
  Operands<T> x{data<const T>(q),
                data<const T>(k),
                data<const T>(v),
                {tq, q.shape[2], spec.q_head, d},
                {k.shape[1], k.shape[2], spec.k_head, d},
                {v.shape[1], v.shape[2], spec.v_head, d},
                {tq, spec.heads, 0, d},
                tq,
                spec.heads,
                spec.kv_heads,
                d,
                {spec.q_begin - spec.kv_begin, k.shape[1], spec.causal, spec.window},
                true};
  uintptr_t bits =
      reinterpret_cast<uintptr_t>(x.q) | reinterpret_cast<uintptr_t>(x.k) | reinterpret_cast<uintptr_t>(x.v);
  for (const void* p : others) bits |= reinterpret_cast<uintptr_t>(p);
  x.aligned = bits % 16 == 0;
  return x;
}

// x with the sinks of `sinks` (undefined: none).
template <class T>
Operands<T> with_sinks(Operands<T> x, const Tensor& sinks) {
  x.sinks = sinks.defined() ? data<const T>(sinks) : nullptr;
  return x;
}

}  // namespace llmtrain::kernels::cuda::attention
