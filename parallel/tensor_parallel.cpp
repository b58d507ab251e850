#include "parallel/tensor_parallel.h"

#include <cstring>

#include "kernels/ops.h"

namespace llmtrain::parallel {

namespace {

int64_t last_dim(const Tensor& t) { return t.shape.rank() ? t.shape[t.shape.rank() - 1] : 1; }

// Host-only column slicing; device tensors need a strided copy op, which comes with the CUDA
// backend.
void require_host(const Tensor& t, const char* what) {
  if (t.device != kernels::Device::cpu)
    throw Error(fmt::format("not supported yet: {} on device memory (comes with the CUDA backend)", what));
}

// dst[r, :] = src[r, col0 : col0 + dst_cols] for every row.
void copy_columns(Tensor dst, Tensor src, int64_t col0) {
  const int64_t dc = last_dim(dst), sc = last_dim(src), rows = dst.numel() / (dc ? dc : 1);
  const size_t es = kernels::dtype_size(dst.dtype);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(dst.data) + size_t(r * dc) * es,
                static_cast<const char*>(src.data) + size_t(r * sc + col0) * es, size_t(dc) * es);
}

}  // namespace

void copy_to_tp_region_forward(Comm&, Tensor) {}
void copy_to_tp_region_backward(Comm& tp, Tensor dx) {
  if (tp.size() > 1) tp.all_reduce(dx, ReduceOp::sum);
}

void reduce_from_tp_region_forward(Comm& tp, Tensor x) {
  if (tp.size() > 1) tp.all_reduce(x, ReduceOp::sum);
}
void reduce_from_tp_region_backward(Comm&, Tensor) {}

void gather_from_tp_region_forward(Comm& tp, Tensor local, Tensor full, Tensor scratch) {
  const int64_t n = tp.size(), lc = last_dim(local);
  LT_CHECK(full.numel() == n * local.numel() && last_dim(full) == n * lc, "gather {} x{} into {}", local.shape.str(), n,
           full.shape.str());
  if (n == 1) {
    if (full.data != local.data) kernels::convert(full, local);
    return;
  }
  require_host(full, "tensor-parallel gather");
  LT_CHECK(scratch.numel() >= full.numel(), "gather scratch of {} for {}", scratch.numel(), full.numel());
  Tensor staged = scratch.flat(0, full.numel());
  tp.all_gather(local, staged);  // [rank][rows][lc]
  const int64_t rows = local.numel() / lc;
  const size_t es = kernels::dtype_size(full.dtype);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < rows; ++i)
      std::memcpy(static_cast<char*>(full.data) + size_t(i * n * lc + r * lc) * es,
                  static_cast<const char*>(staged.data) + size_t((r * rows + i) * lc) * es, size_t(lc) * es);
}

void gather_from_tp_region_backward(Comm& tp, Tensor dfull, Tensor dlocal) {
  scatter_to_tp_region_forward(tp, dfull, dlocal);
}

void scatter_to_tp_region_forward(Comm& tp, Tensor full, Tensor local) {
  const int64_t n = tp.size(), lc = last_dim(local);
  LT_CHECK(full.numel() == n * local.numel() && last_dim(full) == n * lc, "scatter {} into {} x{}", full.shape.str(),
           local.shape.str(), n);
  if (n == 1) {
    if (full.data != local.data) kernels::convert(local, full);
    return;
  }
  require_host(full, "tensor-parallel scatter");
  copy_columns(local, full, tp.rank() * lc);
}

void scatter_to_tp_region_backward(Comm& tp, Tensor dlocal, Tensor dfull, Tensor scratch) {
  gather_from_tp_region_forward(tp, dlocal, dfull, scratch);
}

void vocab_parallel_cross_entropy_forward(Comm& tp, Tensor losses, Tensor lse, Tensor logits, Tensor targets,
                                          int64_t vocab, int32_t ignore_index, Tensor scratch) {
  const int64_t n = losses.numel(), begin = tp.rank() * last_dim(logits);
  LT_CHECK(scratch.numel() >= 3 * n, "cross-entropy scratch of {} for {} rows", scratch.numel(), n);
  const Tensor row_max = scratch.flat(0, n), stats = scratch.flat(n, 2 * n);
  kernels::cross_entropy_shard_max(row_max, logits, begin, vocab);
  if (tp.size() > 1) tp.all_reduce(row_max, ReduceOp::max);
  kernels::cross_entropy_shard_sums(stats, logits, row_max, targets, begin, vocab, ignore_index);
  if (tp.size() > 1) tp.all_reduce(stats, ReduceOp::sum);
  kernels::cross_entropy_combine(losses, lse, row_max, stats, targets, vocab, ignore_index);
}

void vocab_parallel_cross_entropy_backward(Comm& tp, Tensor dlogits, Tensor logits, Tensor lse, Tensor targets,
                                           int64_t vocab, int32_t ignore_index, float loss_scale, Tensor count) {
  kernels::cross_entropy_shard_backward(dlogits, logits, lse, targets, tp.rank() * last_dim(logits), vocab,
                                        ignore_index, loss_scale, count);
}

void replicated_grad_begin(Comm& group, Tensor grad, Tensor saved) {
  if (group.size() == 1) return;
  LT_CHECK(saved.numel() >= grad.numel(), "replicated gradient of {} saved in {}", grad.numel(), saved.numel());
  kernels::copy(saved.flat(0, grad.numel()), grad.view({grad.numel()}));
  kernels::fill_zero(grad);
}

void replicated_grad_end(Comm& group, Tensor grad, Tensor saved) {
  if (group.size() == 1) return;
  const Tensor g = grad.view({grad.numel()});
  group.all_reduce(g, ReduceOp::sum);
  kernels::residual_forward(g.view({1, g.numel()}), g.view({1, g.numel()}),
                            saved.flat(0, g.numel()).view({1, g.numel()}), Tensor{});
}

}  // namespace llmtrain::parallel
