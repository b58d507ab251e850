// Σ x² and x *= s on the device (kernels/cpu/l2norm.cpp is the reference): the sum in chunks of
// 2^14 elements, each summed in fp32 by one block, the chunks added in double in order by one
// thread (which writes the fp32 result on the device), so the result does not depend on the launch
// and is within fp32 rounding of the CPU's.
#include <algorithm>

#include "kernels/cuda/storage.cuh"

namespace llmtrain::kernels::cuda {
namespace {

constexpr int64_t kChunk = kSquaresChunk;
constexpr int kThreads = 256;

// The block's Σ x² over [i0, i1) in fp32 into partial[blockIdx.x], as a double (every thread calls it).
template <class T>
__device__ __forceinline__ void block_squares(double* __restrict__ partial, const T* __restrict__ x, int64_t i0,
                                              int64_t i1) {
  float s = 0.0f;
  for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
    const float e = load(x, i);
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

__global__ void sum_partials_kernel(float* __restrict__ out, const double* __restrict__ partial, int64_t chunks) {
  double s = 0.0;
  for (int64_t c = 0; c < chunks; ++c) s += partial[c];
  *out = float(s);
}

// sum_squares_chunks: block b sums chunk b (its offset and count from the table) as
// chunk_squares_kernel sums one of sum_squares' chunks.
template <class T>
__global__ void table_squares_kernel(double* __restrict__ partial, const T* __restrict__ x,
                                     const int64_t* __restrict__ chunks) {
  const int64_t i0 = chunks[2 * blockIdx.x];
  block_squares(partial, x, i0, i0 + chunks[2 * blockIdx.x + 1]);
}

// Thread j adds segment j's chunk sums in order (in double) and writes the fp32 total.
__global__ void segment_sums_kernel(float* __restrict__ out, const double* __restrict__ partial,
                                    const int64_t* __restrict__ first, int64_t segments) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= segments) return;
  double s = 0.0;
  for (int64_t c = first[j]; c < first[j + 1]; ++c) s += partial[c];
  out[j] = float(s);
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
  LT_LAUNCH(1, 1, 0, compute_stream(), sum_partials_kernel)(out.ptr<float>(), partial, chunks);
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
  LT_LAUNCH(blocks_for(segments, kThreads), kThreads, 0, compute_stream(), segment_sums_kernel)
  (out.ptr<float>(), partial, first.ptr<int64_t>(), segments);
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
