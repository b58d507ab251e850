// Token and position embeddings on the device (kernels/cpu/embedding.cpp is the reference).
//
// The rule a reader could get wrong: the backward's scatter-add never races and has one fixed
// order. The positions are sorted by token id on the device (ties by position); the sorted order is
// cut into pieces of kPiece positions, and a thread per (piece, table column) sums each token's
// positions of its piece in order in fp32. A token wholly inside one piece is added to its table
// row there, once (its positions summed in order, then one add: one rounding for 16-bit storage,
// as on the CPU); a token that spans pieces is added once by the piece where it starts, its
// pieces' sums joined in order. Every add has one owner, nothing depends on scheduling, and a
// token repeated thousands of times is summed by many blocks, not one thread.
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

// The backward's sort: positions by token id, as the unique keys id·2^32 + position (so every
// correct sort gives the same order: positions ascending within an id). First each tile of
// kSortTile keys is sorted in shared memory (bitonic; padding keys are all ones, above every real
// key); then each key's place in the whole order is its place in its tile plus, for every other
// tile, the number of that tile's keys below it (a binary search).
constexpr int kSortTile = 1024, kSortThreads = 256;
// The segment sums: the sorted order in pieces of kPiece positions, a thread per table column.
constexpr int kPiece = 32, kColumns = 128;

__global__ void sort_tiles_kernel(uint64_t* __restrict__ keys, const int32_t* __restrict__ tokens, int64_t n,
                                  int64_t vocab) {
  __shared__ uint64_t tile[kSortTile];
  const int64_t base = int64_t(blockIdx.x) * kSortTile;
  for (int i = threadIdx.x; i < kSortTile; i += blockDim.x) {
    const int64_t r = base + i;
    uint64_t key = ~uint64_t(0);
    if (r < n) {
      const int32_t tok = tokens[r];
      LT_DEVICE_CHECK(tok >= 0 && tok < vocab, "token id %d at position %lld is outside the vocabulary [0, %lld)", tok,
                      (long long)r, (long long)vocab);
      key = uint64_t(uint32_t(tok)) << 32 | uint64_t(r);
    }
    tile[i] = key;
  }
  for (int k = 2; k <= kSortTile; k *= 2)
    for (int j = k / 2; j > 0; j /= 2) {
      __syncthreads();
      for (int i = threadIdx.x; i < kSortTile; i += blockDim.x) {
        const int partner = i ^ j;
        if (partner <= i) continue;
        const uint64_t a = tile[i], b = tile[partner];
        if ((a > b) == ((i & k) == 0)) {
          tile[i] = b;
          tile[partner] = a;
        }
      }
    }
  __syncthreads();
  for (int i = threadIdx.x; i < kSortTile; i += blockDim.x) keys[base + i] = tile[i];
}

// Thread e places key e: sorted_tok and sorted_pos at its rank in the whole order.
__global__ void merge_ranks_kernel(int32_t* __restrict__ sorted_tok, int32_t* __restrict__ sorted_pos,
                                   const uint64_t* __restrict__ keys, int64_t tiles) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= tiles * kSortTile) return;
  const uint64_t key = keys[e];
  if (key == ~uint64_t(0)) return;
  const int64_t own = e / kSortTile;
  int64_t rank = e % kSortTile;
  for (int64_t b = 0; b < tiles; ++b) {
    if (b == own) continue;
    const uint64_t* t = keys + b * kSortTile;
    int lo = 0, hi = kSortTile;  // the first of t's keys that is not below key
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (t[mid] < key)
        lo = mid + 1;
      else
        hi = mid;
    }
    rank += lo;
  }
  sorted_tok[rank] = int32_t(key >> 32);
  sorted_pos[rank] = int32_t(key & 0xffffffffu);
}

// Piece k (sorted positions [k·kPiece, ...)), column j: each run of one token inside the piece is
// summed in order in fp32. A run that lies wholly in the piece is added to its table row here (once:
// its token has no other run); the piece's part of a token that runs over its start (slot 0) or
// past its end (slot 1, when it starts here) goes to partial[k][slot] for segment_join_kernel.
template <class T>
__global__ void segment_pieces_kernel(T* __restrict__ dwte, float* __restrict__ partial, const T* __restrict__ dout,
                                      const int32_t* __restrict__ sorted_tok, const int32_t* __restrict__ sorted_pos,
                                      int64_t n, int64_t v, int64_t c, int64_t vocab_begin) {
  const int64_t k = blockIdx.x, j = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (j >= c) return;
  const int64_t i0 = k * kPiece, i1 = i0 + kPiece < n ? i0 + kPiece : n;
  float s = 0.0f;
  int64_t start = i0;
  for (int64_t i = i0; i < i1; ++i) {
    const int32_t tok = sorted_tok[i];
    s += load(dout, int64_t(sorted_pos[i]) * c + j);
    if (i + 1 < i1 && sorted_tok[i + 1] == tok) continue;
    // The run [start, i] of tok ends in this piece here.
    const bool before = start == i0 && i0 > 0 && sorted_tok[i0 - 1] == tok;
    const bool after = i + 1 == i1 && i1 < n && sorted_tok[i1] == tok;
    const int64_t row = int64_t(tok) - vocab_begin;
    if (row >= 0 && row < v) {
      if (before)
        partial[(2 * k) * c + j] = s;
      else if (after)
        partial[(2 * k + 1) * c + j] = s;
      else
        store(dwte, row * c + j, load(dwte, row * c + j) + s);
    }
    s = 0.0f;
    start = i + 1;
  }
}

// For a piece whose last token starts in it and runs on: its part plus the following pieces' parts
// of that token, in order, added to the table row once.
template <class T>
__global__ void segment_join_kernel(T* __restrict__ dwte, const float* __restrict__ partial,
                                    const int32_t* __restrict__ sorted_tok, int64_t n, int64_t v, int64_t c,
                                    int64_t vocab_begin) {
  const int64_t k = blockIdx.x, j = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (j >= c) return;
  const int64_t pieces = (n + kPiece - 1) / kPiece, i0 = k * kPiece, i1 = i0 + kPiece < n ? i0 + kPiece : n;
  const int32_t tok = sorted_tok[i1 - 1];
  if (i1 == n || sorted_tok[i1] != tok) return;  // the last run ends in this piece
  int64_t start = i1 - 1;
  while (start > i0 && sorted_tok[start - 1] == tok) --start;
  if (start == i0 && i0 > 0 && sorted_tok[i0 - 1] == tok) return;  // it started in an earlier piece
  const int64_t row = int64_t(tok) - vocab_begin;
  if (row < 0 || row >= v) return;
  float s = partial[(2 * k + 1) * c + j];
  for (int64_t q = k + 1; q < pieces; ++q) {
    s += partial[(2 * q) * c + j];
    const int64_t end = (q + 1) * kPiece;
    if (end >= n || sorted_tok[end] != tok) break;
  }
  store(dwte, row * c + j, load(dwte, row * c + j) + s);
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
  const int64_t tiles = (n + kSortTile - 1) / kSortTile, pieces = (n + kPiece - 1) / kPiece;
  // Scratch: the tiles' keys, the sorted ids and positions, two partial rows per piece.
  const size_t key_bytes = size_t(tiles * kSortTile) * sizeof(uint64_t), index_bytes = size_t(2 * n) * sizeof(int32_t);
  const size_t index_at = key_bytes, partial_at = (index_at + index_bytes + 15) / 16 * 16;
  char* scratch = static_cast<char*>(device_scratch(0, partial_at + size_t(2 * pieces * c) * sizeof(float)));
  uint64_t* keys = reinterpret_cast<uint64_t*>(scratch);
  int32_t* sorted_tok = reinterpret_cast<int32_t*>(scratch + index_at);
  int32_t* sorted_pos = sorted_tok + n;
  float* partial = reinterpret_cast<float*>(scratch + partial_at);
  LT_LAUNCH(unsigned(tiles), kSortThreads, 0, compute_stream(), sort_tiles_kernel)
  (keys, tokens.ptr<int32_t>(), n, vocab);
  LT_CUDA_LAUNCHED("sort_tiles_kernel");
  LT_LAUNCH(blocks_of(tiles * kSortTile, kSortThreads), kSortThreads, 0, compute_stream(), merge_ranks_kernel)
  (sorted_tok, sorted_pos, keys, tiles);
  LT_CUDA_LAUNCHED("merge_ranks_kernel");
  const dim3 grid(unsigned(pieces), unsigned((c + kColumns - 1) / kColumns));
  with_storage(dwte, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(grid, kColumns, 0, compute_stream(), segment_pieces_kernel<T>)
    (data<T>(dwte), partial, data<const T>(dout), sorted_tok, sorted_pos, n, v, c, vocab_begin);
  });
  LT_CUDA_LAUNCHED("segment_pieces_kernel");
  with_storage(dwte, [&](auto tag) {
    using T = decltype(tag);
    LT_LAUNCH(grid, kColumns, 0, compute_stream(), segment_join_kernel<T>)
    (data<T>(dwte), partial, sorted_tok, n, v, c, vocab_begin);
  });
  LT_CUDA_LAUNCHED("segment_join_kernel");
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
