// Token and position embeddings on the device (kernels/cpu/embedding.cpp is the reference).
//
// The rule a reader could get wrong: the backward's scatter-add never races. One thread owns one
// column of the table and walks the token rows in order; each distinct token's rows are summed in
// fp32 and added to its table row once (one rounding for 16-bit storage, as on the CPU). That is
// O(N²) token compares per column: simple and deterministic, right for the sizes this backend is
// verified at; a sorted-bucket version (llm.c's) is the faster one for long batches.
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

template <class T>
__global__ void embedding_backward_kernel(T* __restrict__ dwte, const T* __restrict__ dout,
                                          const int32_t* __restrict__ tokens, int64_t n, int64_t v, int64_t c,
                                          int64_t vocab_begin, int64_t vocab) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= c) return;
  for (int64_t r = 0; r < n; ++r) {
    const int32_t tok = tokens[r];
    LT_DEVICE_CHECK(tok >= 0 && tok < vocab, "token id %d at position %lld is outside the vocabulary [0, %lld)", tok,
                    (long long)r, (long long)vocab);
    const int64_t row = int64_t(tok) - vocab_begin;
    if (row < 0 || row >= v) continue;
    bool seen = false;
    for (int64_t q = 0; q < r && !seen; ++q) seen = tokens[q] == tok;
    if (seen) continue;  // added with its first occurrence
    float s = 0.0f;
    for (int64_t q = r; q < n; ++q)
      if (tokens[q] == tok) s += load(dout, q * c + j);
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

void embedding_forward_launch(Storage s, void* out, const int32_t* tokens, const void* wte, int64_t n, int64_t v,
                              int64_t c, int64_t vocab_begin, int64_t vocab) {
  if (n * c == 0) return;
  with_storage(s, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_for(n * c, 256), 256, 0, nullptr, embedding_forward_kernel<T>)
    (static_cast<T*>(out), tokens, static_cast<const T*>(wte), n, v, c, vocab_begin, vocab);
  });
}

void embedding_backward_launch(Storage s, void* dwte, const void* dout, const int32_t* tokens, int64_t n, int64_t v,
                               int64_t c, int64_t vocab_begin, int64_t vocab) {
  if (n * c == 0) return;
  with_storage(s, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(unsigned((c + 63) / 64), 64, 0, nullptr, embedding_backward_kernel<T>)
    (static_cast<T*>(dwte), static_cast<const T*>(dout), tokens, n, v, c, vocab_begin, vocab);
  });
}

void position_embedding_forward_launch(Storage s, void* x, const void* wpe, int64_t b, int64_t t, int64_t c) {
  if (b * t * c == 0) return;
  with_storage(s, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_for(b * t * c, 256), 256, 0, nullptr, position_forward_kernel<T>)
    (static_cast<T*>(x), static_cast<const T*>(wpe), b * t, t, c);
  });
}

void position_embedding_backward_launch(Storage s, void* dwpe, const void* dx, int64_t b, int64_t t, int64_t c) {
  if (t * c == 0) return;
  with_storage(s, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(blocks_for(t * c, 256), 256, 0, nullptr, position_backward_kernel<T>)
    (static_cast<T*>(dwpe), static_cast<const T*>(dx), b, t, c);
  });
}

}  // namespace llmtrain::kernels::cuda
