// The CUDA kernels' host entry points, in plain types: the .cu files define them, and
// kernels/cuda/cuda_ops.cpp calls them with what it unpacks from Tensors (the .cu files include
// nothing that uses fmt, which nvcc's front end rejects). Every launcher queues work on the
// default stream and returns; cuda_ops.cpp checks the launch.
//
// The rule a reader could get wrong: the pointers are device memory, and every float pointer of
// one call has the call's Storage (the fp32 statistics excepted, typed float* here).
#pragma once

#include <cstdint>

namespace llmtrain::kernels::cuda {

// A float tensor's dtype, as the kernels see it.
enum class Storage : uint8_t { fp32, bf16, fp16 };

// convert.cu
void convert_launch(void* out, Storage out_storage, const void* in, Storage in_storage, int64_t n);

// residual.cu: out [n, c] = a + b (+ bias [c]); dbias [c] += column sums of dout [n, c].
void residual_forward_launch(Storage s, void* out, const void* a, const void* b, const void* bias, int64_t n,
                             int64_t c);
void residual_backward_launch(Storage s, void* dbias, const void* dout, int64_t n, int64_t c);

// embedding.cu: the arguments of kernels/ops.h's embedding ops; wpe starts at position pos_begin.
void embedding_forward_launch(Storage s, void* out, const int32_t* tokens, const void* wte, int64_t n, int64_t v,
                              int64_t c, int64_t vocab_begin, int64_t vocab);
// `chains`: device scratch of 2n int32.
void embedding_backward_launch(Storage s, void* dwte, const void* dout, const int32_t* tokens, int32_t* chains,
                               int64_t n, int64_t v, int64_t c, int64_t vocab_begin, int64_t vocab);
void position_embedding_forward_launch(Storage s, void* x, const void* wpe, int64_t b, int64_t t, int64_t c);
void position_embedding_backward_launch(Storage s, void* dwpe, const void* dx, int64_t b, int64_t t, int64_t c);

// layernorm.cu, rmsnorm.cu: rows n of c channels; mean and rstd are fp32; dresidual may be null.
void layernorm_forward_launch(Storage s, void* out, float* mean, float* rstd, const void* in, const void* weight,
                              const void* bias, int64_t n, int64_t c, float eps);
void layernorm_backward_launch(Storage s, void* din, void* dweight, void* dbias, const void* dout, const void* in,
                               const void* weight, const float* mean, const float* rstd, const void* dresidual,
                               int64_t n, int64_t c);
void rmsnorm_forward_launch(Storage s, void* out, float* rstd, const void* in, const void* weight, int64_t n, int64_t c,
                            float eps);
void rmsnorm_backward_launch(Storage s, void* din, void* dweight, const void* dout, const void* in, const void* weight,
                             const float* rstd, const void* dresidual, int64_t n, int64_t c);

// gelu.cu, swiglu.cu: n elements (gelu), n rows of f outputs (swiglu; in has 2f per row).
void gelu_forward_launch(Storage s, void* out, const void* in, int64_t n);
void gelu_backward_launch(Storage s, void* din, const void* dout, const void* in, int64_t n);
void swiglu_forward_launch(Storage s, void* out, const void* in, int64_t n, int64_t f);
void swiglu_backward_launch(Storage s, void* din, const void* dout, const void* in, int64_t n, int64_t f);

// rope.cu: table [p, 2, half] fp32; x [b, t, heads, d] rotated in place (sign -1: the inverse).
void rope_table_launch(float* table, int64_t p, int64_t half, double theta);
void rope_launch(Storage s, void* x, const float* table, int64_t b, int64_t t, int64_t heads, int64_t rotary_heads,
                 int64_t d, int64_t pos_begin, float sign);

// linear.cu (our tiled GEMM): in [n, i], weight [o, i], out [n, o]; bias may be null.
void linear_forward_launch(Storage s, void* out, const void* in, const void* weight, const void* bias, int64_t n,
                           int64_t i, int64_t o);
void linear_backward_input_launch(Storage s, void* din, const void* dout, const void* weight, int64_t n, int64_t i,
                                  int64_t o);
void linear_backward_weight_launch(Storage s, void* dweight, const void* dout, const void* in, int64_t n, int64_t i,
                                   int64_t o);

// cross_entropy.cu: logits [n, vp] of which the first `vocab` columns are real; losses, lse fp32.
void cross_entropy_forward_launch(Storage s, float* losses, float* lse, const void* logits, const int32_t* targets,
                                  int64_t n, int64_t vp, int64_t vocab, int32_t ignore_index);
// The backward over the global columns [col_begin, col_begin + vp) (0 for the whole vocabulary).
void cross_entropy_backward_launch(Storage s, void* dlogits, const void* logits, const float* lse,
                                   const int32_t* targets, const int32_t* count, int64_t n, int64_t vp,
                                   int64_t col_begin, int64_t vocab, int32_t ignore_index, float loss_scale);
void cross_entropy_shard_max_launch(Storage s, float* row_max, const void* logits, int64_t n, int64_t vp,
                                    int64_t col_begin, int64_t vocab);
void cross_entropy_shard_sums_launch(Storage s, float* stats, const void* logits, const float* row_max,
                                     const int32_t* targets, int64_t n, int64_t vp, int64_t col_begin, int64_t vocab,
                                     int32_t ignore_index);
void cross_entropy_combine_launch(float* losses, float* lse, const float* row_max, const float* stats,
                                  const int32_t* targets, int64_t n, int64_t vocab, int32_t ignore_index);
void loss_mean_launch(float* mean, int32_t* count, const float* losses, const int32_t* targets, int64_t n,
                      int32_t ignore_index);

// adamw.cu: params, m, v fp32; the step's constants as kernels/cpu/adamw.cpp derives them.
void adamw_launch(Storage grads_storage, float* params, const void* grads, float* m, float* v, int64_t n, float beta1,
                  float beta2, float eps, float grad_scale, float decay, float step_size, float inv_sqrt_bc2);

// l2norm.cu: total (one double) = Σ x², through `partial` (sum_squares_chunks(n) doubles).
int64_t sum_squares_chunks(int64_t n);
void sum_squares_launch(Storage s, double* total, double* partial, const void* x, int64_t n);
void scale_launch(Storage s, void* x, int64_t n, float factor);

// attention.cu: qkv [b, t, heads + 2·kv_heads, d], out [b, t, heads, d], lse [b, heads, t] fp32;
// d <= kMaxHeadDim (the tiles' shared memory).
inline constexpr int64_t kMaxHeadDim = 128;
void attention_forward_launch(Storage s, void* out, float* lse, const void* qkv, int64_t b, int64_t t, int64_t heads,
                              int64_t kv_heads, int64_t d);
// delta: scratch of b·heads·t floats (δ = dO·O per row, from the dq kernel to the dk/dv kernel).
void attention_backward_launch(Storage s, void* dqkv, float* delta, const void* dout, const void* qkv, const void* out,
                               const float* lse, int64_t b, int64_t t, int64_t heads, int64_t kv_heads, int64_t d);
// Generation (fp32): caches [b, t_max, kv_heads, d]; the t queries sit at positions [position, +t).
void kv_cache_write_launch(float* k_cache, float* v_cache, const float* qkv, int64_t b, int64_t t, int64_t heads,
                           int64_t kv_heads, int64_t d, int64_t t_max, int64_t position);
void attention_cached_forward_launch(float* out, float* lse, const float* qkv, const float* k_cache,
                                     const float* v_cache, int64_t b, int64_t t, int64_t heads, int64_t kv_heads,
                                     int64_t d, int64_t t_max, int64_t position);

}  // namespace llmtrain::kernels::cuda
