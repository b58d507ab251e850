// Σ x² and x *= s on the device (kernels/cpu/l2norm.cpp is the reference): the sum in chunks of
// 2^14 elements, each summed in fp32 by one block (groups of 4 elements per access where aligned),
// the chunks added in double in order by one thread of a block per segment (which writes the fp32
// result on the device), so the result does not depend on the launch or the run and is within fp32
// rounding of the CPU's. No atomics: every sum has one owner and a fixed order.
#include <algorithm>

#include "kernels/cuda/storage.cuh"

namespace llmtrain::kernels::cuda {
namespace {

constexpr int64_t kChunk = kSquaresChunk;
constexpr int kThreads = 256;

// The block's Σ x² over [i0, i1) in fp32 into partial[blockIdx.x], as a double (every thread calls
// it). Each thread sums its elements in a fixed order (a scalar head up to x's first 4-aligned
// element, then groups of 4 read as one access, then a scalar tail), the threads' sums added by
// block_sum's fixed tree: the same bits every run.
template <class T>
__device__ __forceinline__ void block_squares(double* __restrict__ partial, const T* __restrict__ x, int64_t i0,
                                              int64_t i1) {
  const T* c = x + i0;
  const int64_t n = i1 - i0;
  int64_t head = unaligned_head(c);
  head = head < n ? head : n;
  const int64_t groups = (n - head) / 4;
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < head; i += blockDim.x) {
    const float e = load(c, i);
    s += e * e;
  }
  for (int64_t k = threadIdx.x; k < groups; k += blockDim.x) {
    float e[4];
    load4(c, head + 4 * k, e);
    LT_UNROLL
    for (int j = 0; j < 4; ++j) s += e[j] * e[j];
  }
  for (int64_t i = head + 4 * groups + threadIdx.x; i < n; i += blockDim.x) {
    const float e = load(c, i);
    s += e * e;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = double(s);
}

template <class T>
__global__ void chunk_squares_kernel(double* __restrict__ partial, const T* __restrict__ x, int64_t n) {
  const int64_t i0 = int64_t(blockIdx.x) * kChunk;
  block_squares(partial, x, i0, i0 + kChunk < n ? i0 + kChunk : n);
}

// sum_squares_chunks: block b sums chunk b (its offset and count from the table) as
// chunk_squares_kernel sums one of sum_squares' chunks.
template <class T>
__global__ void table_squares_kernel(double* __restrict__ partial, const T* __restrict__ x,
                                     const int64_t* __restrict__ chunks) {
  const int64_t i0 = chunks[2 * blockIdx.x];
  block_squares(partial, x, i0, i0 + chunks[2 * blockIdx.x + 1]);
}

// partial[c0, c1) added in order in double, the total rounded to fp32 into *out (every thread of
// the block calls it). The partials are staged through shared memory a block's width at a time, so
// their loads overlap (one thread walking the 2^11 partials of a 38M-element tensor would wait on
// each load in turn); thread 0 still adds them one after another, the CPU's order.
__device__ __forceinline__ void add_in_order(float* __restrict__ out, const double* __restrict__ partial, int64_t c0,
                                             int64_t c1) {
  __shared__ double staged[kThreads];
  double s = 0.0;
  for (int64_t c = c0; c < c1; c += kThreads) {
    const int64_t count = c1 - c < kThreads ? c1 - c : kThreads;
    __syncthreads();  // thread 0 has added the previous batch
    if (threadIdx.x < count) staged[threadIdx.x] = partial[c + threadIdx.x];
    __syncthreads();
    if (threadIdx.x == 0)
      for (int64_t k = 0; k < count; ++k) s += staged[k];
  }
  if (threadIdx.x == 0) *out = float(s);
}

__global__ void sum_partials_kernel(float* __restrict__ out, const double* __restrict__ partial, int64_t chunks) {
  add_in_order(out, partial, 0, chunks);
}

// Block j adds segment j's chunk sums.
__global__ void segment_sums_kernel(float* __restrict__ out, const double* __restrict__ partial,
                                    const int64_t* __restrict__ first) {
  const int64_t j = blockIdx.x;
  add_in_order(out + j, partial, first[j], first[j + 1]);
}

template <class T>
__global__ void scale_kernel(T* x, int64_t n, float s) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    store(x, i, load(x, i) * s);
}

}  // namespace

void sum_squares(Tensor out, Tensor x) {
  const int64_t n = x.numel(), chunks = (n + kChunk - 1) / kChunk;
  // The chunk partials in device scratch (stream-ordered: the next call's chunks overwrite them
  // only after this call's sum has read them).
  double* partial = static_cast<double*>(device_scratch(1, size_t(std::max<int64_t>(chunks, 1)) * sizeof(double)));
  if (chunks > 0) {
    with_storage(x, [&](auto tag) {
      using T = decltype(tag);
      LT_LAUNCH(unsigned(chunks), kThreads, 0, compute_stream(), chunk_squares_kernel<T>)(partial, data<const T>(x), n);
    });
    LT_CUDA_LAUNCHED("chunk_squares_kernel");
  }
  LT_LAUNCH(1, kThreads, 0, compute_stream(), sum_partials_kernel)(out.ptr<float>(), partial, chunks);
  LT_CUDA_LAUNCHED("sum_partials_kernel");
}

void sum_squares_chunks(Tensor out, Tensor x, Tensor chunks, Tensor first) {
  const int64_t c = chunks.shape[0], segments = out.numel();
  if (segments == 0) return;
  double* partial = static_cast<double*>(device_scratch(1, size_t(std::max<int64_t>(c, 1)) * sizeof(double)));
  if (c > 0) {
    with_storage(x, [&](auto tag) {
      using T = decltype(tag);
      LT_LAUNCH(unsigned(c), kThreads, 0, compute_stream(), table_squares_kernel<T>)
      (partial, data<const T>(x), chunks.ptr<int64_t>());
    });
    LT_CUDA_LAUNCHED("table_squares_kernel");
  }
  LT_LAUNCH(unsigned(segments), kThreads, 0, compute_stream(), segment_sums_kernel)
  (out.ptr<float>(), partial, first.ptr<int64_t>());
  LT_CUDA_LAUNCHED("segment_sums_kernel");
}

void scale(Tensor x, float s) {
  const int64_t n = x.numel();
  if (n == 0) return;
  with_storage(x, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_for(n, 256), 256, 0, compute_stream(), scale_kernel<T>)(data<T>(x), n, s);
  });
  LT_CUDA_LAUNCHED("scale_kernel");
}

}  // namespace llmtrain::kernels::cuda
