// Every op of the transformer: a forward and a backward per op family, declared here from the op
// table (kernels/op_table.def, where each op is written once with its documentation). The device
// of the tensors picks the implementation (kernels/dispatch.cpp is the one switch); the CPU ones
// live in kernels/cpu/<stem>.cpp and the CUDA ones in kernels/cuda/<stem>.cu, forward and backward
// side by side. docs/model.md shows how the model strings them together.
//
// Conventions (the rules a reader could get wrong):
//  - Outputs come first, then inputs. Tensors are contiguous; token ids and targets are int32.
//    All tensors of one call live on one device, except copy()'s two, which is how anything
//    crosses between host and device memory.
//  - Precision: the STORAGE operands of one call (activations, parameters, their gradients) are
//    all fp32, all bf16 or all fp16; ops COMPUTE in fp32 whatever the storage (on the CPU,
//    kernels/dispatch.cpp widens 16-bit operands exactly into the per-thread scratch, runs the fp32
//    kernel and rounds what it writes back once, to nearest even; an accumulating output is read,
//    added to in fp32 and rounded; the CUDA kernels read and write 16-bit storage themselves). The
//    table marks the operands that are fp32 whatever the storage (the statistics, the RoPE table,
//    the optimizer's master weights and moments) and the fp32-only ops (rope_table, the KV cache,
//    loss_mean_forward).
//  - PARAMETER gradients ACCUMULATE (dweight += ...): gradient accumulation over micro-batches
//    and tied weights rely on it; zero them once per optimizer step.
//  - ACTIVATION gradients are OVERWRITTEN (din = ...). Where a gradient joins the residual stream,
//    the op takes the stream's gradient as the input `dresidual` and writes
//    din = dresidual + (its own contribution); din may alias dresidual (in place).
//  - An optional argument is a default-constructed Tensor (no data): `Tensor{}`.
//  - "N" is the number of token rows (batch · seq), "C" the channels of the residual stream.
//    Row n of a [B, T, ...] tensor is token t = n % T of sequence b = n / T.
//  - Ops never allocate per call beyond a per-thread scratch that reaches its high-water mark on
//    the first step; no exception leaves an op (broken shapes are LT_CHECK failures).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/op_table.h"
#include "kernels/tensor.h"

namespace llmtrain::kernels {

// sum_squares' chunk (elements summed in fp32 before the chunks are added in double), which the
// multi-tensor forms' tables cut their ranges at (sum_squares_chunks, adamw_rows).
inline constexpr int64_t kSquaresChunk = int64_t(1) << 14;

// loss_mean_forward's lanes: lane j sums rows j, j + kLossLanes, ... in double in row order, and
// the lanes' sums are added by a fixed binary tree (the CPU and a device block do the same).
inline constexpr int64_t kLossLanes = 256;

// One AdamW step's constants (adamw_rows).
struct AdamWStep {
  float lr = 0;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0;  // 0 for parameters that take none
  int64_t step = 1;        // 1-based: the bias corrections use β^step
  float grad_scale = 1;    // multiplies the gradient first (clipping factor, 1/loss-scale)
  // bf16 parameters updated in place (no fp32 master): the step's stochastic-rounding key
  // (kernels/adamw_math.h rounding_key(seed, step)).
  uint64_t rounding_key = 0;
};

// How rope_table stretches the rotary frequencies for contexts beyond the pretrained one, as
// Hugging Face transformers computes inv_freq (its rope_scaling's rope_type): with
// inv_freq_i = θ^(-2i/D) and wavelen_i = 2π / inv_freq_i,
//   none:   inv_freq_i as it is;
//   linear: inv_freq_i / factor;
//   llama3: (Llama 3.1+) wavelengths longer than original_max_positions / low_freq_factor take
//           inv_freq_i / factor, those shorter than original_max_positions / high_freq_factor keep
//           inv_freq_i, and between the two, with smooth = (original_max_positions / wavelen_i −
//           low_freq_factor) / (high_freq_factor − low_freq_factor), they take
//           (1 − smooth) · inv_freq_i / factor + smooth · inv_freq_i;
//   yarn:   (YaRN; gpt-oss, Qwen's long-context configs) with corr(r) = D · ln(original_max_positions
//           / (2π r)) / (2 ln θ), the pair range [low, high] = [max(corr(beta_fast), 0),
//           min(corr(beta_slow), D − 1)] (floored and ceiled when `truncate`; high + 0.001 when the
//           two meet) and ramp_i = clamp((i − low) / (high − low), 0, 1): the pairs below the range
//           keep inv_freq_i, those above take inv_freq_i / factor, and between,
//           (1 − ramp_i) · inv_freq_i + ramp_i · inv_freq_i / factor. Every cos and sin of the table
//           is then multiplied by attention_factor (transformers' attention_scaling), which scales
//           q and k — and so the attention logits by its square.
struct RopeScaling {
  enum class Type { none, linear, llama3, yarn };
  Type type = Type::none;
  double factor = 1.0;                   // linear, llama3 and yarn
  double low_freq_factor = 1.0;          // llama3
  double high_freq_factor = 4.0;         // llama3
  double original_max_positions = 8192;  // llama3 and yarn: original_max_position_embeddings
  double beta_fast = 32;                 // yarn
  double beta_slow = 1;                  // yarn
  bool truncate = true;                  // yarn
  double attention_factor = 1;           // yarn: the table's cos and sin are multiplied by this
};

// What attention_forward / attention_backward compute: the heads, where they sit in q, k and v,
// where the two blocks sit in the sequence, and which keys each query sees.
//   visible(query at position p, key at position s) = (!causal || s <= p) && (window == 0 || s > p − window)
// so `window` (> 0, causal only) keeps the query's own position and the window − 1 before it, as
// Mistral's sliding window does. A block pair with no visible key at all is legal (its rows come
// out with lse = -inf), which context parallelism's block loops rely on.
struct AttentionSpec {
  int64_t heads = 1, kv_heads = 1;             // query heads; key/value heads (heads % kv_heads == 0)
  int64_t q_head = 0, k_head = 0, v_head = 0;  // the first head of q, k and v in their tensors
  int64_t q_begin = 0, kv_begin = 0;           // the positions of query row 0 and key row 0
  bool causal = true;
  int64_t window = 0;  // 0: no sliding window
  double scale = 0;    // the softmax scale; 0: 1/√D (Gemma's query_pre_attn_scalar sets its own)

  // The scale the scores are multiplied by, for head size d.
  float softmax_scale(int64_t d) const { return float(scale > 0 ? scale : 1.0 / std::sqrt(double(d))); }

  // Self-attention over one packed [B, T, heads + 2·kv_heads, D] tensor (q, then k, then v heads),
  // within `window` keys when > 0, with softmax scale `scale` (0: 1/√D).
  static AttentionSpec packed(int64_t heads, int64_t kv_heads, int64_t window = 0, double scale = 0) {
    return {.heads = heads,
            .kv_heads = kv_heads,
            .q_head = 0,
            .k_head = heads,
            .v_head = heads + kv_heads,
            .window = window,
            .scale = scale};
  }
};

#define LT_OP LT_OP_DECLARE
#include "kernels/op_table.def"
#undef LT_OP

// ---- outside the table: memory movement between devices ------------------------------------

// out = in, byte for byte (same dtype and element count), between any two devices: host to
// device, device to host, or within one. The model stages a micro-batch's token ids with it and
// reads its loss back with it; a copy into host memory of a device tensor is a synchronization
// point on that device (it waits for the work that produces `in`).
void copy(Tensor out, Tensor in);
// out = in between any two devices and any two float dtypes (convert's rounding): where both the
// devices and the dtypes differ, through a host copy in the device side's dtype. Checkpoints move
// 16-bit state (bf16 moments, bf16 parameters without a master) to and from host fp32 with it.
void copy_convert(Tensor out, Tensor in);
// Waits until every op queued on `device` is done: a no-op on the CPU, whose ops finish before they
// return; on a GPU, where a launch returns at once, the step's phase timers call it so that each
// phase's time is its ops' own.
void synchronize(Device device);

// ---- the common forms of attention ----------------------------------------------------------

// Causal self-attention over a packed qkv [B, T, heads + 2·kv_heads, D] (training).
inline void attention_forward(Tensor out, Tensor lse, Tensor qkv, int64_t heads, int64_t kv_heads) {
  attention_forward(out, lse, qkv, qkv, qkv, Tensor{}, AttentionSpec::packed(heads, kv_heads));
}
// Its backward: dqkv [B, T, heads + 2·kv_heads, D] is overwritten (q, k and v parts).
inline void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int64_t heads,
                               int64_t kv_heads) {
  attention_backward(dqkv, dqkv, dqkv, Tensor{}, dout, qkv, qkv, qkv, out, lse, Tensor{},
                     AttentionSpec::packed(heads, kv_heads));
}
// Decoding: causal attention of qkv's q heads (query i at position + i) over cache rows
// [0, position + T), which kv_cache_write must already have filled; the same result
// attention_forward gives those rows over the whole sequence (within `window` keys when > 0, with
// the softmax scale and the sinks given).
inline void attention_cached_forward(Tensor out, Tensor lse, Tensor qkv, Tensor k_cache, Tensor v_cache, int64_t heads,
                                     int64_t kv_heads, int64_t position, int64_t window = 0, double scale = 0,
                                     Tensor sinks = Tensor{}) {
  attention_forward(
      out, lse, qkv, k_cache, v_cache, sinks,
      {.heads = heads, .kv_heads = kv_heads, .q_begin = position, .kv_begin = 0, .window = window, .scale = scale});
}

}  // namespace llmtrain::kernels
