// Every op of the transformer, declared once: a forward and a backward per op family. The device
// of the tensors picks the implementation (kernels/dispatch.cpp is the one switch); the CPU ones
// live in kernels/cpu/<stem>.cpp, forward and backward side by side. docs/model.md shows how the
// model strings them together.
//
// Conventions (the rules a reader could get wrong):
//  - Outputs come first, then inputs. Tensors are contiguous; token ids and targets are int32.
//    All tensors of one call live on one device, except copy()'s two, which is how anything
//    crosses between host and device memory.
//  - Precision: the STORAGE operands of one call (activations, parameters, their gradients) are
//    all fp32, all bf16 or all fp16; ops COMPUTE in fp32 whatever the storage (kernels/dispatch.cpp
//    widens 16-bit operands exactly into the per-thread scratch, runs the fp32 kernel and rounds
//    what it writes back once, to nearest even; an accumulating output is read, added to in fp32
//    and rounded). The only other dtypes allowed in a 16-bit call are the fp32 STATISTICS — norm
//    mean/rstd, attention and cross-entropy lse, per-row losses, the loss, the vocab-parallel
//    loss's row maxima and sums — the RoPE table, and adamw_update, whose params and moments are
//    the fp32 master (its gradients may be 16-bit). rope_table, the KV-cache ops (generation) and
//    loss_mean_forward are fp32 only.
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

#include <cstdint>

#include "kernels/tensor.h"

namespace llmtrain::kernels {

// ---- memory --------------------------------------------------------------------------------

void fill_zero(Tensor x);
// out = in, converting between fp32, bf16 and fp16 (round to nearest even, dtype_convert.h), or
// a plain copy when the dtypes match.
void convert(Tensor out, Tensor in);
// out = in, byte for byte (same dtype and element count), between any two devices: host to
// device, device to host, or within one. The model stages a micro-batch's token ids with it and
// reads its loss back with it; a copy into host memory of a device tensor is a synchronization
// point on that device (it waits for the work that produces `in`).
void copy(Tensor out, Tensor in);
// Waits until every op queued on `device` is done: a no-op on the CPU, whose ops finish before they
// return; on a GPU, where a launch returns at once, the step's phase timers call it so that each
// phase's time is its ops' own.
void synchronize(Device device);

// ---- embeddings (cpu/embedding.cpp) --------------------------------------------------------

// out[n, :] = wte[tokens[n] - vocab_begin, :] when the token falls in this shard's rows
// [vocab_begin, vocab_begin + V), else 0 (vocab-parallel embedding; vocab_begin = 0 unsharded).
// out [N, C], tokens [N] int32, wte [V, C]. `vocab` is the number of real token ids of the whole
// vocabulary: an id outside [0, vocab) is a broken invariant (the data loader and the tokenizer
// only produce real ids) and fails an LT_CHECK naming the id and its position.
void embedding_forward(Tensor out, Tensor tokens, Tensor wte, int64_t vocab_begin, int64_t vocab);
// dwte[tokens[n] - vocab_begin, :] += dout[n, :] for the tokens in this shard (ids checked as above).
void embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int64_t vocab_begin, int64_t vocab);

// Learned positions, added in place: x[b, t, :] += wpe[pos_begin + t, :]. x [B, T, C], wpe [P, C].
void position_embedding_forward(Tensor x, Tensor wpe, int64_t pos_begin);
// dwpe[pos_begin + t, :] += sum over b of dx[b, t, :].
void position_embedding_backward(Tensor dwpe, Tensor dx, int64_t pos_begin);

// ---- normalization (cpu/layernorm.cpp, cpu/rmsnorm.cpp) -------------------------------------

// out = (in - mean) · rstd · weight + bias per row; saves mean [N] and rstd [N] for backward.
void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor in, Tensor weight, Tensor bias, float eps);
// din = dresidual + d(in); dweight, dbias accumulate. dresidual is optional; din may alias it.
void layernorm_backward(Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in, Tensor weight, Tensor mean,
                        Tensor rstd, Tensor dresidual);

// out = in · rstd · weight with rstd = 1 / sqrt(mean(in²) + eps); saves rstd [N].
void rmsnorm_forward(Tensor out, Tensor rstd, Tensor in, Tensor weight, float eps);
void rmsnorm_backward(Tensor din, Tensor dweight, Tensor dout, Tensor in, Tensor weight, Tensor rstd, Tensor dresidual);

// ---- linear (cpu/linear.cpp) ---------------------------------------------------------------

// out [N, O] = in [N, I] · weight [O, I]ᵀ (+ bias [O]). weight is nn.Linear's [out, in] layout.
void linear_forward(Tensor out, Tensor in, Tensor weight, Tensor bias);
// din [N, I] = dout · weight (skipped when din is absent); dweight += doutᵀ · in; dbias += Σ rows
// of dout (when present).
void linear_backward(Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in, Tensor weight);
// din [N, I] = dout [N, O] · weight [O, I] only: a backward split in two (zero-bubble pipeline
// schedules) computes the weight gradient later, with linear_backward and an absent din.
void linear_backward_input(Tensor din, Tensor dout, Tensor weight);

// ---- activations (cpu/gelu.cpp, cpu/swiglu.cpp) --------------------------------------------

// GELU with GPT-2's tanh approximation: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
void gelu_forward(Tensor out, Tensor in);
// din may alias dout.
void gelu_backward(Tensor din, Tensor dout, Tensor in);

// LLaMA's MLP gate: in [N, 2F] holds [gate | up] per row (the fused gate_proj/up_proj output);
// out [N, F] = silu(gate) · up.
void swiglu_forward(Tensor out, Tensor in);
// din [N, 2F] may alias in (the gate/up activations are dead after this).
void swiglu_backward(Tensor din, Tensor dout, Tensor in);

// ---- rotary position embedding (cpu/rope.cpp) ----------------------------------------------

// table [P, 2, D/2]: row p holds cos(p·θ^(-2i/D)) for i < D/2, then the sines; computed in
// double (D = head dim).
void rope_table(Tensor table, double theta);
// In place on x [B, T, heads, D]: rotates the first `rotary_heads` heads of every row (so a
// packed [q | k | v] row rotates q and k and leaves v), position = pos_begin + t, in Hugging
// Face's rotate-half convention (pairs (i, i + D/2)).
void rope_forward(Tensor x, Tensor table, int64_t rotary_heads, int64_t pos_begin);
// The inverse rotation, in place on the gradient.
void rope_backward(Tensor dx, Tensor table, int64_t rotary_heads, int64_t pos_begin);

// ---- attention (cpu/attention.cpp) ---------------------------------------------------------

// Causal self-attention with grouped-query heads over a packed projection:
//   qkv [B, T, heads + 2·kv_heads, D] holds, per token, q heads, then k heads, then v heads
//   (q head h reads kv head h / (heads / kv_heads)); softmax scale 1/√D.
//   out [B, T, heads, D]; lse [B, heads, T] is each query row's log-sum-exp, saved for backward.
// The CPU kernel is written over (pointer, row stride) views of q, k and v with a query position
// offset, so the KV-cache form below runs the same core.
void attention_forward(Tensor out, Tensor lse, Tensor qkv, int64_t heads, int64_t kv_heads);
// dqkv [B, T, heads + 2·kv_heads, D] is overwritten (q, k and v parts).
void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int64_t heads, int64_t kv_heads);

// Decoding with a KV cache (generation; forward only). k_cache and v_cache [B, T_max, kv_heads, D]
// hold the keys and values of positions already seen; qkv [B, T, heads + 2·kv_heads, D] is packed
// as above for the T tokens at positions [position, position + T).
// Writes the k and v heads of qkv into cache rows [position, position + T).
void kv_cache_write(Tensor k_cache, Tensor v_cache, Tensor qkv, int64_t heads, int64_t kv_heads, int64_t position);
// Causal attention of qkv's q heads (query i at position + i) over cache rows [0, position + T),
// which kv_cache_write must already have filled. out [B, T, heads, D], lse [B, heads, T] as in
// attention_forward; the same result attention_forward gives those rows over the whole sequence.
void attention_cached_forward(Tensor out, Tensor lse, Tensor qkv, Tensor k_cache, Tensor v_cache, int64_t heads,
                              int64_t kv_heads, int64_t position);

// ---- residual stream (cpu/residual.cpp) ----------------------------------------------------

// out [N, C] = a + b (+ bias [C], broadcast over rows; the bias of a row-parallel linear is added
// here, after its all-reduce). out may alias a or b.
void residual_forward(Tensor out, Tensor a, Tensor b, Tensor bias);
// The gradients of a and b are dout itself (no copy is made); this only accumulates
// dbias += Σ rows of dout.
void residual_backward(Tensor dbias, Tensor dout);

// ---- loss (cpu/cross_entropy.cpp) ----------------------------------------------------------

// Softmax cross-entropy over the first `vocab` columns of logits [N, Vpad] (padding columns are
// excluded from the softmax). losses [N] gets -log p(target) per row, or 0 where target ==
// ignore_index; lse [N] is saved for backward. loss_mean_forward takes the mean over counted rows.
// A target outside [0, vocab) other than ignore_index fails an LT_CHECK naming it and its row.
void cross_entropy_forward(Tensor losses, Tensor lse, Tensor logits, Tensor targets, int64_t vocab,
                           int32_t ignore_index);
// The objective is loss_scale · mean: dlogits = dloss · (softmax - onehot(target)) for counted
// rows with dloss = loss_scale / float(count) (0 when count is 0), 0 for ignored rows and padding
// columns. count [1] int32 is loss_mean_forward's. dlogits may alias logits (it is then
// overwritten in place).
void cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor lse, Tensor targets, int64_t vocab,
                            int32_t ignore_index, float loss_scale, Tensor count);

// The same loss over a vocabulary split by columns (the vocab-parallel cross-entropy of
// parallel/tensor_parallel.h runs these between its all-reduces). logits [N, Vl] hold the global
// columns [col_begin, col_begin + Vl); those >= vocab are padding and take no part.
//   shard_max:  row_max [N] = the largest logit of this shard's real columns (-inf when none).
//   shard_sums: with row_max the maximum over every shard, stats [2, N]: row 0 = Σ exp(x − max)
//               over this shard's real columns (NaN when one is not finite), row 1 = the target's
//               logit where this shard holds its column, else 0.
//   combine:    with stats summed over the shards: lse = max + log Σ, losses = lse − target logit
//               (0 for ignored rows); targets outside [0, vocab) fail as in cross_entropy_forward.
//   shard_backward: cross_entropy_backward restricted to this shard's columns.
void cross_entropy_shard_max(Tensor row_max, Tensor logits, int64_t col_begin, int64_t vocab);
void cross_entropy_shard_sums(Tensor stats, Tensor logits, Tensor row_max, Tensor targets, int64_t col_begin,
                              int64_t vocab, int32_t ignore_index);
void cross_entropy_combine(Tensor losses, Tensor lse, Tensor row_max, Tensor stats, Tensor targets, int64_t vocab,
                           int32_t ignore_index);
void cross_entropy_shard_backward(Tensor dlogits, Tensor logits, Tensor lse, Tensor targets, int64_t col_begin,
                                  int64_t vocab, int32_t ignore_index, float loss_scale, Tensor count);

// The loss of a micro-batch: count [1] int32 = rows whose target is not ignore_index, mean [1]
// fp32 = their losses [N] summed in double in row order, divided by count in double and rounded
// once to float; 0 when no row counts (the micro-batch then contributes nothing). Kept exactly
// so: the loss and its gradient must not depend on the device or the thread count.
void loss_mean_forward(Tensor mean, Tensor count, Tensor losses, Tensor targets, int32_t ignore_index);

// ---- optimizer (cpu/adamw.cpp, cpu/l2norm.cpp) ---------------------------------------------

struct AdamWStep {
  float lr = 0;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0;  // 0 for parameters that take none
  int64_t step = 1;        // 1-based: the bias corrections use β^step
  float grad_scale = 1;    // multiplies the gradient first (clipping factor, 1/loss-scale)
};
// PyTorch's AdamW on a range, in place on params, m and v (all the same length):
//   g = grad_scale·grad;  p -= lr·wd·p;  m = β1·m + (1-β1)·g;  v = β2·v + (1-β2)·g²;
//   p -= lr/(1-β1^t) · m / (√v/√(1-β2^t) + eps).
void adamw_update(Tensor params, Tensor grads, Tensor m, Tensor v, const AdamWStep& s);

// Σ x², accumulated in double. For the global gradient norm (the caller all-reduces the partial
// sums over every group that splits parameters, then takes the square root).
double sum_squares(Tensor x);
// x *= s in place.
void scale(Tensor x, float s);

}  // namespace llmtrain::kernels
