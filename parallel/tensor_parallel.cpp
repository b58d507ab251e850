#include "parallel/tensor_parallel.h"

#include <cstring>
#include <span>

#include "common/error.h"
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
  LT_CHECK(scratch.numel() >= full.numel() && scratch.dtype == local.dtype && full.dtype == local.dtype,
           "gather scratch of {} {} for {} {}", scratch.numel(), kernels::to_string(scratch.dtype), full.numel(),
           kernels::to_string(local.dtype));
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
  LT_CHECK(full.dtype == local.dtype, "scatter {} into {}", kernels::to_string(full.dtype),
           kernels::to_string(local.dtype));
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

namespace {

int64_t defined_numel(std::span<const Tensor> grads) {
  int64_t n = 0;
  for (const Tensor& g : grads)
    if (g.defined()) n += g.numel();
  return n;
}

}  // namespace

void replicated_grads_begin(Comm& group, std::span<const Tensor> grads, Tensor saved) {
  if (group.size() == 1) return;
  const int64_t total = defined_numel(grads);
  LT_CHECK(saved.numel() >= (grads.size() > 1 ? 2 : 1) * total, "replicated gradients of {} saved in {}", total,
           saved.numel());
  for (const Tensor& g : grads)
    LT_CHECK(!g.defined() || g.dtype == saved.dtype, "replicated {} gradients saved as {}", kernels::to_string(g.dtype),
             kernels::to_string(saved.dtype));
  int64_t at = 0;
  for (const Tensor& g : grads) {
    if (!g.defined()) continue;
    kernels::copy(saved.flat(at, g.numel()), g.view({g.numel()}));
    kernels::fill_zero(g);
    at += g.numel();
  }
}

void replicated_grads_end(Comm& group, std::span<const Tensor> grads, Tensor saved) {
  if (group.size() == 1) return;
  const int64_t total = defined_numel(grads);
  auto row = [](const Tensor& t) { return t.view({1, t.numel()}); };
  if (grads.size() == 1) {  // in place
    const Tensor g = grads[0].view({total});
    group.all_reduce(g, ReduceOp::sum);
    kernels::residual_forward(row(g), row(g), row(saved.flat(0, total)), Tensor{});
    return;
  }
  // Several tensors: packed after the saved gradients, one all-reduce.
  const Tensor pack = saved.flat(total, total);
  int64_t at = 0;
  for (const Tensor& g : grads)
    if (g.defined()) {
      kernels::copy(pack.flat(at, g.numel()), g.view({g.numel()}));
      at += g.numel();
    }
  group.all_reduce(pack, ReduceOp::sum);
  at = 0;
  for (const Tensor& g : grads)
    if (g.defined()) {
      kernels::residual_forward(row(g), row(saved.flat(at, g.numel())), row(pack.flat(at, g.numel())), Tensor{});
      at += g.numel();
    }
}

void gather_from_sequence_parallel_region_forward(Comm& tp, Tensor local, Tensor full) {
  LT_CHECK(full.numel() == tp.size() * local.numel(), "sequence gather of {} x{} into {}", local.shape.str(), tp.size(),
           full.shape.str());
  if (tp.size() == 1) {
    if (full.data != local.data) kernels::copy(full, local);
    return;
  }
  tp.all_gather(local, full);
}

void gather_from_sequence_parallel_region_backward(Comm& tp, Tensor dfull, Tensor dlocal) {
  reduce_scatter_to_sequence_parallel_region_forward(tp, dfull, dlocal);
}

void reduce_scatter_to_sequence_parallel_region_forward(Comm& tp, Tensor full, Tensor local) {
  LT_CHECK(full.numel() == tp.size() * local.numel(), "sequence reduce-scatter of {} into {} x{}", full.shape.str(),
           local.shape.str(), tp.size());
  if (tp.size() == 1) {
    if (full.data != local.data) kernels::copy(local, full);
    return;
  }
  tp.reduce_scatter(full, local, ReduceOp::sum);
}

void reduce_scatter_to_sequence_parallel_region_backward(Comm& tp, Tensor dlocal, Tensor dfull) {
  gather_from_sequence_parallel_region_forward(tp, dlocal, dfull);
}

}  // namespace llmtrain::parallel
