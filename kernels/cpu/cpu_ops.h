// The CPU backend's ops: the same signatures as kernels/ops.h, called only by kernels/dispatch.cpp
// after it has checked shapes, dtypes and devices. One file per op family in this folder.
#pragma once

#include "kernels/ops.h"

namespace llmtrain::kernels::cpu {

void fill_zero(Tensor x);
void convert(Tensor out, Tensor in);
void copy(Tensor out, Tensor in);
void embedding_forward(Tensor out, Tensor tokens, Tensor wte, int64_t vocab_begin, int64_t vocab);
void embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int64_t vocab_begin, int64_t vocab);
void position_embedding_forward(Tensor x, Tensor wpe, int64_t pos_begin);
void position_embedding_backward(Tensor dwpe, Tensor dx, int64_t pos_begin);
void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor in, Tensor weight, Tensor bias, float eps);
void layernorm_backward(Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in, Tensor weight, Tensor mean,
                        Tensor rstd, Tensor dresidual);
void rmsnorm_forward(Tensor out, Tensor rstd, Tensor in, Tensor weight, float eps);
void rmsnorm_backward(Tensor din, Tensor dweight, Tensor dout, Tensor in, Tensor weight, Tensor rstd, Tensor dresidual);
void linear_forward(Tensor out, Tensor in, Tensor weight, Tensor bias);
void linear_backward(Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in, Tensor weight);
void linear_backward_input(Tensor din, Tensor dout, Tensor weight);
void gelu_forward(Tensor out, Tensor in);
void gelu_backward(Tensor din, Tensor dout, Tensor in);
void swiglu_forward(Tensor out, Tensor in);
void swiglu_backward(Tensor din, Tensor dout, Tensor in);
void rope_table(Tensor table, double theta);
void rope_forward(Tensor x, Tensor table, int64_t rotary_heads, int64_t pos_begin);
void rope_backward(Tensor dx, Tensor table, int64_t rotary_heads, int64_t pos_begin);
void attention_forward(Tensor out, Tensor lse, Tensor qkv, int64_t heads, int64_t kv_heads);
void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int64_t heads, int64_t kv_heads);
void kv_cache_write(Tensor k_cache, Tensor v_cache, Tensor qkv, int64_t heads, int64_t kv_heads, int64_t position);
void attention_cached_forward(Tensor out, Tensor lse, Tensor qkv, Tensor k_cache, Tensor v_cache, int64_t heads,
                              int64_t kv_heads, int64_t position);
void residual_forward(Tensor out, Tensor a, Tensor b, Tensor bias);
void residual_backward(Tensor dbias, Tensor dout);
void cross_entropy_forward(Tensor losses, Tensor lse, Tensor logits, Tensor targets, int64_t vocab,
                           int32_t ignore_index);
void cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor lse, Tensor targets, int64_t vocab,
                            int32_t ignore_index, float loss_scale, Tensor count);
void cross_entropy_shard_max(Tensor row_max, Tensor logits, int64_t col_begin, int64_t vocab);
void cross_entropy_shard_sums(Tensor stats, Tensor logits, Tensor row_max, Tensor targets, int64_t col_begin,
                              int64_t vocab, int32_t ignore_index);
void cross_entropy_combine(Tensor losses, Tensor lse, Tensor row_max, Tensor stats, Tensor targets, int64_t vocab,
                           int32_t ignore_index);
void cross_entropy_shard_backward(Tensor dlogits, Tensor logits, Tensor lse, Tensor targets, int64_t col_begin,
                                  int64_t vocab, int32_t ignore_index, float loss_scale, Tensor count);
void loss_mean_forward(Tensor mean, Tensor count, Tensor losses, Tensor targets, int32_t ignore_index);
void adamw_update(Tensor params, Tensor grads, Tensor m, Tensor v, const AdamWStep& s);
double sum_squares(Tensor x);
void scale(Tensor x, float s);

// Which form attention's block products take: automatic picks the widest vector form the CPU and
// the head dim allow (AVX-512 when the head dim is a multiple of 16, AVX2 for multiples of 8,
// else OpenBLAS). Tests pin each form in turn; nothing else should call this.
enum class AttentionIsa { automatic, blas, avx2, avx512 };
void set_attention_isa(AttentionIsa isa);
bool cpu_has_avx512();

}  // namespace llmtrain::kernels::cpu
