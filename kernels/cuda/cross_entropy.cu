// Softmax cross-entropy on the device (kernels/cpu/cross_entropy.cpp is the reference): one block
// per row for the log-sum-exp (one pass over the logits, online max and sum) and the gradient (one
// pass: read, write), both in groups of 4 elements per access where aligned; the vocab-parallel pieces (shard max,
// shard sums, combine, shard backward) and the micro-batch's mean loss.
//
// The rules a reader could get wrong: a row with a non-finite logit gets a NaN loss (the probe
// Σ x·0 is NaN then), never a finite number; dlogits may alias logits (each element read, then
// written, by one thread); loss_mean sums in double in the op table's fixed order (a thread per
// lane, then the lanes' tree), so the mean is bitwise the CPU's for the same losses (kernels/ops.h
// asks for that).
#include "kernels/cuda/storage.cuh"

namespace llmtrain::kernels::cuda {
namespace {

constexpr int kThreads = 128;

// Row `row`'s lse (its log-sum-exp l) and loss, l minus the target's logit (0 for an ignored
// target; a target outside the vocabulary is a broken invariant), as the CPU's finish_row.
template <class Logit>
__device__ void finish_row(float* lse, float* losses, int64_t row, double l, int32_t t, int64_t vocab,
                           int32_t ignore_index, Logit target_logit) {
  lse[row] = float(l);
  if (t == ignore_index) {
    losses[row] = 0.0f;
    return;
  }
  LT_DEVICE_CHECK(t >= 0 && t < vocab, "target %d at position %lld is outside the vocabulary [0, %lld)", t,
                  (long long)row, (long long)vocab);
  losses[row] = float(l - double(target_logit(t)));
}

// Calls f(j, x) for each of the columns [0, n) of row x that this thread owns, in a fixed order: a
// scalar head up to x's first 4-aligned element, groups of 4 read as one access, a scalar tail.
template <class T, class F>
__device__ __forceinline__ void for_row_columns(const T* x, int64_t n, F&& f) {
  int64_t head = unaligned_head(x);
  head = head < n ? head : n;
  const int64_t groups = (n - head) / 4;
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) f(j, load(x, j));
  for (int64_t k = threadIdx.x; k < groups; k += blockDim.x) {
    float e[4];
    load4(x, head + 4 * k, e);
    LT_UNROLL
    for (int q = 0; q < 4; ++q) f(head + 4 * k + q, e[q]);
  }
  for (int64_t j = head + 4 * groups + threadIdx.x; j < n; j += blockDim.x) f(j, load(x, j));
}

// One pass over the row: each thread keeps its running maximum m and Σ exp(x − m), rescaled when
// m grows (online softmax); the threads' pairs are joined at the block's maximum.
template <class T>
__global__ void cross_entropy_forward_kernel(float* __restrict__ losses, float* __restrict__ lse,
                                             const T* __restrict__ logits, const int32_t* __restrict__ targets,
                                             int64_t vp, int64_t vocab, int32_t ignore_index) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * vp;
  float m = -INFINITY, s = 0.0f, probe = 0.0f;
  for_row_columns(x, vocab, [&](int64_t, float v) {
    probe += v * 0.0f;
    if (v > m) {
      s = s * expf(m - v) + 1.0f;  // expf(-inf) = 0 for the first value
      m = v;
    } else if (v != -INFINITY) {
      s += expf(v - m);
    }
  });
  const float mx = block_max(m);
  s = block_sum(s > 0.0f ? s * expf(m - mx) : s);  // a thread that saw only -inf adds 0 (NaN stays NaN)
  probe = block_sum(probe);
  if (threadIdx.x != 0) return;
  finish_row(lse, losses, row, double(mx) + log(double(s)), targets[row], vocab, ignore_index,
             [&](int32_t t) { return probe == 0.0f ? load(x, t) : NAN; });
}

// Columns [col_begin, col_begin + vp) of the vocabulary (the whole row when col_begin is 0 and vp
// covers it); `real` of them are real, the rest padding. One pass: each element read, its gradient
// written (in groups of 4 where both rows are aligned alike).
template <class T>
__global__ void cross_entropy_backward_kernel(T* dlogits, const T* logits, const float* __restrict__ lse,
                                              const int32_t* __restrict__ targets, const int32_t* __restrict__ count,
                                              int64_t vp, int64_t col_begin, int64_t real, int64_t vocab,
                                              int32_t ignore_index, float loss_scale) {
  const int64_t row = blockIdx.x;
  const int32_t t = targets[row];
  const int32_t counted = *count;
  const float dloss = counted > 0 ? loss_scale / float(counted) : 0.0f;
  if (t != ignore_index)
    LT_DEVICE_CHECK(t >= 0 && t < vocab, "target %d at position %lld is outside the vocabulary [0, %lld)", t,
                    (long long)row, (long long)vocab);
  const float l = lse[row];
  const T* x = logits + row * vp;
  T* dx = dlogits + row * vp;
  auto grad = [&](int64_t j, float v) {
    float d = 0.0f;
    if (t != ignore_index && j < real) {
      d = dloss * expf(v - l);
      if (j + col_begin == t) d -= dloss;
    }
    return d;
  };
  int64_t head = unaligned_head(x);
  head = head < vp ? head : vp;
  if (!aligned4(dx + head)) head = vp;
  const int64_t groups = (vp - head) / 4;
  for (int64_t j = threadIdx.x; j < head; j += blockDim.x) store(dx, j, grad(j, load(x, j)));
  for (int64_t k = threadIdx.x; k < groups; k += blockDim.x) {
    const int64_t j = head + 4 * k;
    float e[4];
    load4(x, j, e);
    LT_UNROLL
    for (int q = 0; q < 4; ++q) e[q] = grad(j + q, e[q]);
    store4(dx, j, e);
  }
  for (int64_t j = head + 4 * groups + threadIdx.x; j < vp; j += blockDim.x) store(dx, j, grad(j, load(x, j)));
}

template <class T>
__global__ void shard_max_kernel(float* __restrict__ row_max, const T* __restrict__ logits, int64_t vp, int64_t real) {
  const int64_t row = blockIdx.x;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < real; j += blockDim.x) mx = fmaxf(mx, load(logits, row * vp + j));
  mx = block_max(mx);
  if (threadIdx.x == 0) row_max[row] = mx;
}

template <class T>
__global__ void shard_sums_kernel(float* __restrict__ stats, const T* __restrict__ logits,
                                  const float* __restrict__ row_max, const int32_t* __restrict__ targets, int64_t n,
                                  int64_t vp, int64_t col_begin, int64_t real, int32_t ignore_index) {
  const int64_t row = blockIdx.x;
  const float mx = row_max[row];
  float s = 0.0f, probe = 0.0f;
  for (int64_t j = threadIdx.x; j < real; j += blockDim.x) {
    const float v = load(logits, row * vp + j);
    probe += v * 0.0f;
    s += expf(v - mx);
  }
  s = block_sum(s);
  probe = block_sum(probe);
  if (threadIdx.x != 0) return;
  stats[row] = probe == 0.0f ? s : NAN;
  const int32_t t = targets[row];
  stats[n + row] =
      t != ignore_index && t >= col_begin && t < col_begin + real ? load(logits, row * vp + (t - col_begin)) : 0.0f;
}

__global__ void combine_kernel(float* __restrict__ losses, float* __restrict__ lse, const float* __restrict__ row_max,
                               const float* __restrict__ stats, const int32_t* __restrict__ targets, int64_t n,
                               int64_t vocab, int32_t ignore_index) {
  for (int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; row < n; row += int64_t(gridDim.x) * blockDim.x) {
    // NaN where a logit was not finite (the sum is NaN).
    finish_row(lse, losses, row, double(row_max[row]) + log(double(stats[row])), targets[row], vocab, ignore_index,
               [&](int32_t) { return stats[n + row]; });
  }
}

// One block of kLossLanes threads: thread j is lane j of loss_mean_forward's order (the counted
// rows j, j + kLossLanes, ... in double), then the binary tree of the lanes in shared memory.
__global__ void loss_mean_kernel(float* __restrict__ mean, int32_t* __restrict__ count,
                                 const float* __restrict__ losses, const int32_t* __restrict__ targets, int64_t n,
                                 int32_t ignore_index) {
  __shared__ double lane[kLossLanes];
  __shared__ int64_t lane_count[kLossLanes];
  const int j = int(threadIdx.x);
  double sum = 0.0;
  int64_t counted = 0;
  for (int64_t i = j; i < n; i += kLossLanes)
    if (targets[i] != ignore_index) {
      sum += double(losses[i]);
      ++counted;
    }
  lane[j] = sum;
  lane_count[j] = counted;
  for (int h = int(kLossLanes) / 2; h > 0; h /= 2) {
    __syncthreads();
    if (j < h) {
      lane[j] += lane[j + h];
      lane_count[j] += lane_count[j + h];
    }
  }
  if (j != 0) return;
  *count = int32_t(lane_count[0]);
  *mean = lane_count[0] ? float(lane[0] / double(lane_count[0])) : 0.0f;
}

}  // namespace

namespace {

// logits [n, vp] (global columns [col_begin, col_begin + vp)): n, vp and the real columns.
struct Columns {
  int64_t n, vp, real;
  Columns(const Tensor& logits, int64_t col_begin, int64_t vocab)
      : n(0), vp(logits.shape[logits.shape.rank() - 1]), real(0) {
    n = vp ? logits.numel() / vp : 0;
    real = vocab - col_begin < 0 ? 0 : (vocab - col_begin > vp ? vp : vocab - col_begin);
  }
};

}  // namespace

void cross_entropy_forward(Tensor losses, Tensor lse, Tensor logits, Tensor targets, int64_t vocab,
                           int32_t ignore_index) {
  const Columns cols(logits, 0, vocab);
  if (cols.n == 0) return;
  with_storage(logits, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(unsigned(cols.n), kThreads, 0, compute_stream(), cross_entropy_forward_kernel<T>)
    (losses.ptr<float>(), lse.ptr<float>(), data<const T>(logits), targets.ptr<int32_t>(), cols.vp, vocab,
     ignore_index);
  });
  LT_CUDA_LAUNCHED("cross_entropy_forward_kernel");
}

void cross_entropy_shard_backward(Tensor dlogits, Tensor logits, Tensor lse, Tensor targets, int64_t col_begin,
                                  int64_t vocab, int32_t ignore_index, float loss_scale, Tensor count) {
  const Columns cols(logits, col_begin, vocab);
  if (cols.n == 0) return;
  with_storage(dlogits, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(unsigned(cols.n), kThreads, 0, compute_stream(), cross_entropy_backward_kernel<T>)
    (data<T>(dlogits), data<const T>(logits), lse.ptr<float>(), targets.ptr<int32_t>(), count.ptr<int32_t>(), cols.vp,
     col_begin, cols.real, vocab, ignore_index, loss_scale);
  });
  LT_CUDA_LAUNCHED("cross_entropy_backward_kernel");
}

// The whole vocabulary is the shard of columns [0, vp).
void cross_entropy_backward(Tensor dlogits, Tensor logits, Tensor lse, Tensor targets, int64_t vocab,
                            int32_t ignore_index, float loss_scale, Tensor count) {
  cuda::cross_entropy_shard_backward(dlogits, logits, lse, targets, 0, vocab, ignore_index, loss_scale, count);
}

void cross_entropy_shard_max(Tensor row_max, Tensor logits, int64_t col_begin, int64_t vocab) {
  const Columns cols(logits, col_begin, vocab);
  if (cols.n == 0) return;
  with_storage(logits, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(unsigned(cols.n), kThreads, 0, compute_stream(), shard_max_kernel<T>)
    (row_max.ptr<float>(), data<const T>(logits), cols.vp, cols.real);
  });
  LT_CUDA_LAUNCHED("shard_max_kernel");
}

void cross_entropy_shard_sums(Tensor stats, Tensor logits, Tensor row_max, Tensor targets, int64_t col_begin,
                              int64_t vocab, int32_t ignore_index) {
  const Columns cols(logits, col_begin, vocab);
  if (cols.n == 0) return;
  with_storage(logits, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(unsigned(cols.n), kThreads, 0, compute_stream(), shard_sums_kernel<T>)
    (stats.ptr<float>(), data<const T>(logits), row_max.ptr<float>(), targets.ptr<int32_t>(), cols.n, cols.vp,
     col_begin, cols.real, ignore_index);
  });
  LT_CUDA_LAUNCHED("shard_sums_kernel");
}

void cross_entropy_combine(Tensor losses, Tensor lse, Tensor row_max, Tensor stats, Tensor targets, int64_t vocab,
                           int32_t ignore_index) {
  const int64_t n = losses.numel();
  if (n == 0) return;
  LT_LAUNCH(blocks_for(n, 128), 128, 0, compute_stream(), combine_kernel)
  (losses.ptr<float>(), lse.ptr<float>(), row_max.ptr<float>(), stats.ptr<float>(), targets.ptr<int32_t>(), n, vocab,
   ignore_index);
  LT_CUDA_LAUNCHED("combine_kernel");
}

void loss_mean_forward(Tensor mean, Tensor count, Tensor losses, Tensor targets, int32_t ignore_index) {
  LT_LAUNCH(1, unsigned(kLossLanes), 0, compute_stream(), loss_mean_kernel)
  (mean.ptr<float>(), count.ptr<int32_t>(), losses.ptr<float>(), targets.ptr<int32_t>(), losses.numel(), ignore_index);
  LT_CUDA_LAUNCHED("loss_mean_kernel");
}

namespace {

template <class T>
__global__ void softcap_forward_kernel(T* x, float cap, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store(x, i, cap * tanhf(load(x, i) / cap));
}

template <class T>
__global__ void softcap_backward_kernel(T* dx, const T* dy, const T* y, float cap, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float t = load(y, i) / cap;  // dx may alias dy or y: each element read, then written, by one thread
    store(dx, i, load(dy, i) * (1.0f - t * t));
  }
}

}  // namespace

void softcap_forward(Tensor x, float cap) {
  const int64_t n = x.numel();
  if (n == 0) return;
  with_storage(x, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_for(n, 256), 256, 0, compute_stream(), softcap_forward_kernel<T>)(data<T>(x), cap, n);
  });
  LT_CUDA_LAUNCHED("softcap_forward_kernel");
}

void softcap_backward(Tensor dx, Tensor dy, Tensor y, float cap) {
  const int64_t n = y.numel();
  if (n == 0) return;
  with_storage(dx, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_for(n, 256), 256, 0, compute_stream(), softcap_backward_kernel<T>)
    (data<T>(dx), data<const T>(dy), data<const T>(y), cap, n);
  });
  LT_CUDA_LAUNCHED("softcap_backward_kernel");
}

}  // namespace llmtrain::kernels::cuda
