// Token and position embeddings on the device (kernels/cpu/embedding.cpp is the reference).
//
// The rule a reader could get wrong: the backward's scatter-add never races. A first kernel links
// the rows of each token into a chain (O(N²) token compares, once per call, a thread per row); then
// one thread owns one column of the table and, for each distinct token, sums its rows in order in
// fp32 and adds that to the table row once (one rounding for 16-bit storage, as on the CPU).
// Deterministic; a sorted-bucket version (llm.c's) is the faster one for long batches.
#include "kernels/cuda/storage.cuh"

namespace llmtrain::kernels::cuda {
namespace {

template <class T>
__global__ void embedding_forward_kernel(T* __restrict__ out, const int32_t* __restrict__ tokens,
                                         const T* __restrict__ wte, int64_t n, int64_t v, int64_t c,
                                         int64_t vocab_begin, int64_t vocab) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n * c; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / c, j = i % c;
    const int32_t tok = tokens[r];
    LT_DEVICE_CHECK(tok >= 0 && tok < vocab, "token id %d at position %lld is outside the vocabulary [0, %lld)", tok,
                    (long long)r, (long long)vocab);
    const int64_t row = int64_t(tok) - vocab_begin;
    store(out, i, row >= 0 && row < v ? load(wte, row * c + j) : 0.0f);
  }
}

// For each token row r: head[r] = 1 when no earlier row has its token, next[r] = the next row
// with the same token (-1 at the end of the chain). One thread per row; ids checked here.
__global__ void token_chains_kernel(int32_t* __restrict__ head, int32_t* __restrict__ next,
                                    const int32_t* __restrict__ tokens, int64_t n, int64_t vocab) {
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < n; r += int64_t(gridDim.x) * blockDim.x) {
    const int32_t tok = tokens[r];
    LT_DEVICE_CHECK(tok >= 0 && tok < vocab, "token id %d at position %lld is outside the vocabulary [0, %lld)", tok,
                    (long long)r, (long long)vocab);
    int32_t first = 1;
    for (int64_t q = 0; q < r && first; ++q) first = tokens[q] != tok;
    int32_t after = -1;
    for (int64_t q = r + 1; q < n && after < 0; ++q)
      if (tokens[q] == tok) after = int32_t(q);
    head[r] = first;
    next[r] = after;
  }
}

// One thread per table column: each distinct token's rows, in order, summed then added once.
template <class T>
__global__ void embedding_backward_kernel(T* __restrict__ dwte, const T* __restrict__ dout,
                                          const int32_t* __restrict__ tokens, const int32_t* __restrict__ head,
                                          const int32_t* __restrict__ next, int64_t n, int64_t v, int64_t c,
                                          int64_t vocab_begin) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= c) return;
  for (int64_t r = 0; r < n; ++r) {
    if (!head[r]) continue;
    const int64_t row = int64_t(tokens[r]) - vocab_begin;
    if (row < 0 || row >= v) continue;
    float s = 0.0f;
    for (int64_t q = r; q >= 0; q = next[q]) s += load(dout, q * c + j);
    store(dwte, row * c + j, load(dwte, row * c + j) + s);
  }
}

template <class T>
__global__ void position_forward_kernel(T* x, const T* __restrict__ wpe, int64_t rows, int64_t t, int64_t c) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * c; i += int64_t(gridDim.x) * blockDim.x)
    store(x, i, load(x, i) + load(wpe, (i / c % t) * c + i % c));
}

// One thread per (position, column): the batch's rows summed in order.
template <class T>
__global__ void position_backward_kernel(T* __restrict__ dwpe, const T* __restrict__ dx, int64_t b, int64_t t,
                                         int64_t c) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < t * c; i += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int64_t q = 0; q < b; ++q) s += load(dx, q * t * c + i);
    store(dwpe, i, load(dwpe, i) + s);
  }
}

}  // namespace

void embedding_forward(Tensor out, Tensor tokens, Tensor wte, int64_t vocab_begin, int64_t vocab) {
  const int64_t n = tokens.numel(), v = wte.shape[0], c = wte.shape[1];
  if (n * c == 0) return;
  with_storage(out, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_for(n * c, 256), 256, 0, compute_stream(), embedding_forward_kernel<T>)
    (data<T>(out), tokens.ptr<int32_t>(), data<const T>(wte), n, v, c, vocab_begin, vocab);
  });
  LT_CUDA_LAUNCHED("embedding_forward_kernel");
}

void embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int64_t vocab_begin, int64_t vocab) {
  const int64_t n = tokens.numel(), v = dwte.shape[0], c = dwte.shape[1];
  if (n * c == 0) return;
  int32_t* head = static_cast<int32_t*>(device_scratch(0, size_t(2 * n) * sizeof(int32_t)));
  int32_t* next = head + n;
  const int32_t* ids = tokens.ptr<int32_t>();
  LT_LAUNCH(blocks_for(n, 128), 128, 0, compute_stream(), token_chains_kernel)(head, next, ids, n, vocab);
  LT_CUDA_LAUNCHED("token_chains_kernel");
  with_storage(dwte, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(unsigned((c + 63) / 64), 64, 0, compute_stream(), embedding_backward_kernel<T>)
    (data<T>(dwte), data<const T>(dout), ids, head, next, n, v, c, vocab_begin);
  });
  LT_CUDA_LAUNCHED("embedding_backward_kernel");
}

// x [b, t, c] += wpe rows [pos_begin, pos_begin + t).
void position_embedding_forward(Tensor x, Tensor wpe, int64_t pos_begin) {
  const int64_t b = x.shape[0], t = x.shape[1], c = x.shape[2];
  if (b * t * c == 0) return;
  with_storage(x, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_for(b * t * c, 256), 256, 0, compute_stream(), position_forward_kernel<T>)
    (data<T>(x), data<const T>(wpe) + pos_begin * c, b * t, t, c);
  });
  LT_CUDA_LAUNCHED("position_forward_kernel");
}

void position_embedding_backward(Tensor dwpe, Tensor dx, int64_t pos_begin) {
  const int64_t b = dx.shape[0], t = dx.shape[1], c = dx.shape[2];
  if (t * c == 0) return;
  with_storage(dwpe, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_for(t * c, 256), 256, 0, compute_stream(), position_backward_kernel<T>)
    (data<T>(dwpe) + pos_begin * c, data<const T>(dx), b, t, c);
  });
  LT_CUDA_LAUNCHED("position_backward_kernel");
}

}  // namespace llmtrain::kernels::cuda
