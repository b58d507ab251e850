// The CUDA backend's ops (kernels/cuda/cuda_ops.h): each unpacks its Tensors (already checked by
// kernels/dispatch.cpp) into the plain arguments of its launcher (kernels/cuda/launch.h, defined in
// the op family's .cu file) and checks the launch.
//
// The rule a reader could get wrong: nothing here touches tensor memory; a Tensor's data pointer
// is device memory and only travels to the kernels.
#include "kernels/cuda/cuda_ops.h"

#include <cuda_runtime_api.h>

#include <cmath>

#include "common/error.h"
#include "kernels/buffer.h"
#include "kernels/cuda/cuda_check.h"
#if LLMTRAIN_CUBLASLT
#include "kernels/cuda/cublaslt.h"
#endif
#include "kernels/cuda/launch.h"

namespace llmtrain::kernels::cuda {
namespace {

Storage storage(const Tensor& t) {
  switch (t.dtype) {
    case DType::fp32:
      return Storage::fp32;
    case DType::bf16:
      return Storage::bf16;
    case DType::fp16:
      return Storage::fp16;
    default:
      break;
  }
  LT_CHECK(false, "CUDA op: {} is not a float storage dtype", to_string(t.dtype));
  __builtin_unreachable();
}

const void* data_or_null(const Tensor& t) { return t.defined() ? t.data : nullptr; }
int64_t last_dim(const Tensor& t) { return t.shape.rank() == 0 ? 1 : t.shape[t.shape.rank() - 1]; }

// Device scratch of this host thread, grown to its high-water mark once (ops allocate nothing per
// call after that); `slot` keeps users that live at the same time apart.
void* scratch_bytes(int slot, size_t bytes) {
  thread_local Buffer buffers[2];
  Buffer& b = buffers[slot];
  if (b.bytes() < bytes) b = Buffer(DType::uint8, {int64_t(bytes)}, Device::cuda);
  return b.data();
}
int32_t* scratch_ints(int64_t n) { return static_cast<int32_t*>(scratch_bytes(0, size_t(n) * sizeof(int32_t))); }

}  // namespace

void convert(Tensor out, Tensor in) {
  if (out.dtype == in.dtype) {
    if (out.bytes() > 0 && out.data != in.data)
      LT_CUDA(cudaMemcpyAsync(out.data, in.data, out.bytes(), cudaMemcpyDeviceToDevice, nullptr));
    return;
  }
  convert_launch(out.data, storage(out), in.data, storage(in), out.numel());
  LT_CUDA_LAUNCHED("convert_kernel");
}

void residual_forward(Tensor out, Tensor a, Tensor b, Tensor bias) {
  const int64_t total = out.numel(), c = bias.defined() ? bias.numel() : (total ? total : 1);
  residual_forward_launch(storage(out), out.data, a.data, b.data, data_or_null(bias), total / c, c);
  LT_CUDA_LAUNCHED("residual_forward_kernel");
}

void residual_backward(Tensor dbias, Tensor dout) {
  const int64_t c = dbias.numel();
  residual_backward_launch(storage(dbias), dbias.data, dout.data, c ? dout.numel() / c : 0, c);
  LT_CUDA_LAUNCHED("column_sums_kernel (residual_backward)");
}

void embedding_forward(Tensor out, Tensor tokens, Tensor wte, int64_t vocab_begin, int64_t vocab) {
  embedding_forward_launch(storage(out), out.data, tokens.ptr<int32_t>(), wte.data, tokens.numel(), wte.shape[0],
                           wte.shape[1], vocab_begin, vocab);
  LT_CUDA_LAUNCHED("embedding_forward_kernel");
}

void embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int64_t vocab_begin, int64_t vocab) {
  const int64_t n = tokens.numel();
  embedding_backward_launch(storage(dwte), dwte.data, dout.data, tokens.ptr<int32_t>(), scratch_ints(2 * n), n,
                            dwte.shape[0], dwte.shape[1], vocab_begin, vocab);
  LT_CUDA_LAUNCHED("token_chains_kernel / embedding_backward_kernel");
}

void position_embedding_forward(Tensor x, Tensor wpe, int64_t pos_begin) {
  const int64_t c = x.shape[2];
  const char* w = static_cast<const char*>(wpe.data) + pos_begin * c * int64_t(dtype_size(wpe.dtype));
  position_embedding_forward_launch(storage(x), x.data, w, x.shape[0], x.shape[1], c);
  LT_CUDA_LAUNCHED("position_forward_kernel");
}

void position_embedding_backward(Tensor dwpe, Tensor dx, int64_t pos_begin) {
  const int64_t c = dx.shape[2];
  char* w = static_cast<char*>(dwpe.data) + pos_begin * c * int64_t(dtype_size(dwpe.dtype));
  position_embedding_backward_launch(storage(dwpe), w, dx.data, dx.shape[0], dx.shape[1], c);
  LT_CUDA_LAUNCHED("position_backward_kernel");
}

void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor in, Tensor weight, Tensor bias, float eps) {
  const int64_t c = weight.numel();
  layernorm_forward_launch(storage(out), out.data, mean.ptr<float>(), rstd.ptr<float>(), in.data, weight.data,
                           bias.data, c ? in.numel() / c : 0, c, eps);
  LT_CUDA_LAUNCHED("layernorm_forward_kernel");
}

void layernorm_backward(Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in, Tensor weight, Tensor mean,
                        Tensor rstd, Tensor dresidual) {
  const int64_t c = weight.numel();
  layernorm_backward_launch(storage(din), din.data, dweight.data, dbias.data, dout.data, in.data, weight.data,
                            mean.ptr<float>(), rstd.ptr<float>(), data_or_null(dresidual), c ? in.numel() / c : 0, c);
  LT_CUDA_LAUNCHED("layernorm_backward_kernel");
}

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor in, Tensor weight, float eps) {
  const int64_t c = weight.numel();
  rmsnorm_forward_launch(storage(out), out.data, rstd.ptr<float>(), in.data, weight.data, c ? in.numel() / c : 0, c,
                         eps);
  LT_CUDA_LAUNCHED("rmsnorm_forward_kernel");
}

void rmsnorm_backward(Tensor din, Tensor dweight, Tensor dout, Tensor in, Tensor weight, Tensor rstd,
                      Tensor dresidual) {
  const int64_t c = weight.numel();
  rmsnorm_backward_launch(storage(din), din.data, dweight.data, dout.data, in.data, weight.data, rstd.ptr<float>(),
                          data_or_null(dresidual), c ? in.numel() / c : 0, c);
  LT_CUDA_LAUNCHED("rmsnorm_backward_kernel");
}

// The linear layer's three products. Row-major X[r, c] is column-major Xᵀ, so each goes to cuBLASLt
// transposed: out = in·Wᵀ is outᵀ[o, n] = W[o, i]·inᵀ[i, n]; din = dout·W is dinᵀ[i, n] =
// Wᵀ[i, o]·doutᵀ[o, n]; dW += doutᵀ·in is dWᵀ[i, o] += inᵀ[i, n]·dout[n, o].
void linear_forward(Tensor out, Tensor in, Tensor weight, Tensor bias) {
  const int64_t o = weight.shape[0], i = weight.shape[1], n = i ? in.numel() / i : 0;
#if LLMTRAIN_CUBLASLT
  if (gemm_uses_cublaslt() && cublaslt_matmul(storage(out), out.data, weight.data, in.data, data_or_null(bias), o, n, i,
                                              i, i, o, true, false, false))
    return;
#endif
  linear_forward_launch(storage(out), out.data, in.data, weight.data, data_or_null(bias), n, i, o);
  LT_CUDA_LAUNCHED("gemm_kernel (linear_forward)");
}

void linear_backward_input(Tensor din, Tensor dout, Tensor weight) {
  const int64_t o = weight.shape[0], i = weight.shape[1], n = o ? dout.numel() / o : 0;
#if LLMTRAIN_CUBLASLT
  if (gemm_uses_cublaslt() &&
      cublaslt_matmul(storage(din), din.data, weight.data, dout.data, nullptr, i, n, o, i, o, i, false, false, false))
    return;
#endif
  linear_backward_input_launch(storage(din), din.data, dout.data, weight.data, n, i, o);
  LT_CUDA_LAUNCHED("gemm_kernel (linear_backward_input)");
}

void linear_backward(Tensor din, Tensor dweight, Tensor dbias, Tensor dout, Tensor in, Tensor weight) {
  const int64_t o = weight.shape[0], i = weight.shape[1], n = o ? dout.numel() / o : 0;
  if (din.defined()) cuda::linear_backward_input(din, dout, weight);
  bool done = false;
#if LLMTRAIN_CUBLASLT
  done = gemm_uses_cublaslt() && cublaslt_matmul(storage(dweight), dweight.data, in.data, dout.data, nullptr, i, o, n,
                                                 i, o, i, false, true, true);
#endif
  if (!done) {
    linear_backward_weight_launch(storage(dweight), dweight.data, dout.data, in.data, n, i, o);
    LT_CUDA_LAUNCHED("gemm_kernel (linear_backward weight)");
  }
  if (dbias.defined()) {
    residual_backward_launch(storage(dbias), dbias.data, dout.data, n, o);
    LT_CUDA_LAUNCHED("column_sums_kernel (linear_backward bias)");
  }
}

void cross_entropy_forward(Tensor losses, Tensor lse, Tensor logits, Tensor targets, int64_t vocab,
                           int32_t ignore_index) {
  const int64_t vp = last_dim(logits);
  cross_entropy_forward_launch(storage(logits), losses.ptr<float>(), lse.ptr<float>(), logits.data,
                               targets.ptr<int32_t>(), vp ? logits.numel() / vp : 0, vp, vocab, ignore_index);
  LT_CUDA_LAUNCHED("cross_entropy_forward_kernel");
}

void cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor lse, Tensor targets, int64_t vocab,
                            int32_t ignore_index, float loss_scale, Tensor count) {
  const int64_t vp = last_dim(logits);
  cross_entropy_backward_launch(storage(dlogits), dlogits.data, logits.data, lse.ptr<float>(), targets.ptr<int32_t>(),
                                count.ptr<int32_t>(), vp ? logits.numel() / vp : 0, vp, 0, vocab, ignore_index,
                                loss_scale);
  LT_CUDA_LAUNCHED("cross_entropy_backward_kernel");
}

void cross_entropy_shard_max(Tensor row_max, Tensor logits, int64_t col_begin, int64_t vocab) {
  const int64_t vp = last_dim(logits);
  cross_entropy_shard_max_launch(storage(logits), row_max.ptr<float>(), logits.data, vp ? logits.numel() / vp : 0, vp,
                                 col_begin, vocab);
  LT_CUDA_LAUNCHED("shard_max_kernel");
}

void cross_entropy_shard_sums(Tensor stats, Tensor logits, Tensor row_max, Tensor targets, int64_t col_begin,
                              int64_t vocab, int32_t ignore_index) {
  const int64_t vp = last_dim(logits);
  cross_entropy_shard_sums_launch(storage(logits), stats.ptr<float>(), logits.data, row_max.ptr<float>(),
                                  targets.ptr<int32_t>(), vp ? logits.numel() / vp : 0, vp, col_begin, vocab,
                                  ignore_index);
  LT_CUDA_LAUNCHED("shard_sums_kernel");
}

void cross_entropy_combine(Tensor losses, Tensor lse, Tensor row_max, Tensor stats, Tensor targets, int64_t vocab,
                           int32_t ignore_index) {
  cross_entropy_combine_launch(losses.ptr<float>(), lse.ptr<float>(), row_max.ptr<float>(), stats.ptr<float>(),
                               targets.ptr<int32_t>(), losses.numel(), vocab, ignore_index);
  LT_CUDA_LAUNCHED("combine_kernel");
}

void cross_entropy_shard_backward(Tensor dlogits, Tensor logits, Tensor lse, Tensor targets, int64_t col_begin,
                                  int64_t vocab, int32_t ignore_index, float loss_scale, Tensor count) {
  const int64_t vp = last_dim(logits);
  cross_entropy_backward_launch(storage(dlogits), dlogits.data, logits.data, lse.ptr<float>(), targets.ptr<int32_t>(),
                                count.ptr<int32_t>(), vp ? logits.numel() / vp : 0, vp, col_begin, vocab, ignore_index,
                                loss_scale);
  LT_CUDA_LAUNCHED("cross_entropy_backward_kernel (shard)");
}

void loss_mean_forward(Tensor mean, Tensor count, Tensor losses, Tensor targets, int32_t ignore_index) {
  loss_mean_launch(mean.ptr<float>(), count.ptr<int32_t>(), losses.ptr<float>(), targets.ptr<int32_t>(), losses.numel(),
                   ignore_index);
  LT_CUDA_LAUNCHED("loss_mean_kernel");
}

void adamw_update(Tensor params, Tensor grads, Tensor m, Tensor v, const AdamWStep& s) {
  // The constants exactly as kernels/cpu/adamw.cpp computes them.
  const double bc1 = 1.0 - std::pow(double(s.beta1), double(s.step));
  const double bc2 = 1.0 - std::pow(double(s.beta2), double(s.step));
  const float step_size = float(double(s.lr) / bc1), inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  const float decay = 1.0f - s.lr * s.weight_decay;
  adamw_launch(storage(grads), params.ptr<float>(), grads.data, m.ptr<float>(), v.ptr<float>(), params.numel(), s.beta1,
               s.beta2, s.eps, s.grad_scale, decay, step_size, inv_sqrt_bc2);
  LT_CUDA_LAUNCHED("adamw_kernel");
}

double sum_squares(Tensor x) {
  // The total and the chunk partials in device scratch.
  double* total = static_cast<double*>(scratch_bytes(1, size_t(1 + sum_squares_chunks(x.numel())) * sizeof(double)));
  sum_squares_launch(storage(x), total, total + 1, x.data, x.numel());
  LT_CUDA_LAUNCHED("chunk_squares_kernel");
  double result = 0;
  LT_CUDA(cudaMemcpy(&result, total, sizeof(result), cudaMemcpyDeviceToHost));
  return result;
}

void scale(Tensor x, float s) {
  scale_launch(storage(x), x.data, x.numel(), s);
  LT_CUDA_LAUNCHED("scale_kernel");
}

void check_head_dim(int64_t d) {
  if (d > kMaxHeadDim)
    throw Error(fmt::format("not supported yet: attention with head dim {} on CUDA (the kernel takes up to {})", d,
                            kMaxHeadDim),
                "use a model with model.hidden / model.heads <= 128, or train.device: cpu");
}

void attention_forward(Tensor out, Tensor lse, Tensor qkv, int64_t heads, int64_t kv_heads) {
  const int64_t d = qkv.shape[3];
  check_head_dim(d);
  attention_forward_launch(storage(qkv), out.data, lse.ptr<float>(), qkv.data, qkv.shape[0], qkv.shape[1], heads,
                           kv_heads, d);
  LT_CUDA_LAUNCHED("attention_forward_kernel");
}

void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int64_t heads, int64_t kv_heads) {
  const int64_t d = qkv.shape[3];
  check_head_dim(d);
  float* delta = static_cast<float*>(scratch_bytes(1, size_t(lse.numel()) * sizeof(float)));
  attention_backward_launch(storage(qkv), dqkv.data, delta, dout.data, qkv.data, out.data, lse.ptr<float>(),
                            qkv.shape[0], qkv.shape[1], heads, kv_heads, d);
  LT_CUDA_LAUNCHED("attention_backward_dq_kernel / attention_backward_dkv_kernel");
}

void kv_cache_write(Tensor k_cache, Tensor v_cache, Tensor qkv, int64_t heads, int64_t kv_heads, int64_t position) {
  kv_cache_write_launch(k_cache.ptr<float>(), v_cache.ptr<float>(), qkv.ptr<float>(), qkv.shape[0], qkv.shape[1], heads,
                        kv_heads, qkv.shape[3], k_cache.shape[1], position);
  LT_CUDA_LAUNCHED("kv_cache_write_kernel");
}

void attention_cached_forward(Tensor out, Tensor lse, Tensor qkv, Tensor k_cache, Tensor v_cache, int64_t heads,
                              int64_t kv_heads, int64_t position) {
  const int64_t d = qkv.shape[3];
  check_head_dim(d);
  attention_cached_forward_launch(out.ptr<float>(), lse.ptr<float>(), qkv.ptr<float>(), k_cache.ptr<float>(),
                                  v_cache.ptr<float>(), qkv.shape[0], qkv.shape[1], heads, kv_heads, d,
                                  k_cache.shape[1], position);
  LT_CUDA_LAUNCHED("attention_forward_kernel (cached)");
}

void gelu_forward(Tensor out, Tensor in) {
  gelu_forward_launch(storage(out), out.data, in.data, in.numel());
  LT_CUDA_LAUNCHED("gelu_forward_kernel");
}

void gelu_backward(Tensor din, Tensor dout, Tensor in) {
  gelu_backward_launch(storage(din), din.data, dout.data, in.data, in.numel());
  LT_CUDA_LAUNCHED("gelu_backward_kernel");
}

void swiglu_forward(Tensor out, Tensor in) {
  const int64_t f = last_dim(out);
  swiglu_forward_launch(storage(out), out.data, in.data, f ? out.numel() / f : 0, f);
  LT_CUDA_LAUNCHED("swiglu_forward_kernel");
}

void swiglu_backward(Tensor din, Tensor dout, Tensor in) {
  const int64_t f = last_dim(dout);
  swiglu_backward_launch(storage(din), din.data, dout.data, in.data, f ? dout.numel() / f : 0, f);
  LT_CUDA_LAUNCHED("swiglu_backward_kernel");
}

void rope_table(Tensor table, double theta) {
  rope_table_launch(table.ptr<float>(), table.shape[0], table.shape[2], theta);
  LT_CUDA_LAUNCHED("rope_table_kernel");
}

void rope_forward(Tensor x, Tensor table, int64_t rotary_heads, int64_t pos_begin) {
  rope_launch(storage(x), x.data, table.ptr<float>(), x.shape[0], x.shape[1], x.shape[2], rotary_heads, x.shape[3],
              pos_begin, 1.0f);
  LT_CUDA_LAUNCHED("rope_kernel");
}

void rope_backward(Tensor dx, Tensor table, int64_t rotary_heads, int64_t pos_begin) {
  rope_launch(storage(dx), dx.data, table.ptr<float>(), dx.shape[0], dx.shape[1], dx.shape[2], rotary_heads,
              dx.shape[3], pos_begin, -1.0f);
  LT_CUDA_LAUNCHED("rope_kernel");
}

}  // namespace llmtrain::kernels::cuda
