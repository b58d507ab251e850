// The simulator's model of CUDA's WMMA API (nvcuda::wmma, CUDA's <mma.h>): what a kernel that
// includes kernels/cuda/wmma.cuh sees under the host compiler. The subset modelled is the 16×16×16
// shape with __nv_bfloat16 or __half inputs (matrix_a, matrix_b; row_major or col_major) and float
// accumulators; any other fragment fails to compile, saying so.
//
// The contract is the CUDA C++ Programming Guide's, enforced:
// - load_matrix_sync, store_matrix_sync and mma_sync are made by all 32 lanes of a full warp,
//   converged (one call site), with the same mptr, ldm and layout: a whole-warp rendezvous
//   (cuda_sim::warp_whole). A lane that exited, a different pointer, ldm or layout in one lane, a
//   warp of fewer than 32 threads abort naming the call; a lane waiting elsewhere is a deadlock the
//   simulator reports naming the call.
// - mptr is 256-bit (32-byte) aligned; ldm, in elements, is a multiple of 16 bytes (8 for 16-bit
//   elements, 4 for float). No other rule: ldm may be below 16 (rows then overlap).
// - Which (row, column) a lane's x[i] holds is unspecified: here it is a random permutation drawn
//   afresh at every launch, per fragment kind (matrix_a row/col, matrix_b row/col, accumulator).
//   Element-wise work on x[] (scale every element, convert) stays correct under any mapping; a
//   kernel that assumes which row a lane holds, or that an accumulator's x[i] is the same element
//   as a matrix_a fragment's x[i], computes a wrong result.
// - A lane's load reads memory when it arrives at the call, its store writes when it leaves it: a
//   load of what other lanes wrote without a __syncwarp (or __syncthreads) between, or a read of
//   another lane's stored elements without one after the store, reads stale data.
// mma_sync computes D = A·B + C with each product of the 16-bit inputs exact in fp32 and the sums in
// fp32 (C first, then k = 0..15); d may be c: every input is gathered before any output is written.
//
// The rule a reader could get wrong: num_elements (8 here) is not CUDA's promise; CUDA's fragments
// may hold more elements per lane (16 for a 16-bit matrix_a on sm_80 and sm_90). Loop over
// num_elements, never a constant.
#pragma once

#include <cstdint>
#include <source_location>
#include <string>
#include <type_traits>

#include "kernels/cuda/sim/sim.h"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int m, int n, int k, class T, class Layout = void>
class fragment;

}  // namespace nvcuda::wmma

namespace llmtrain::cuda_sim::wmma_model {

namespace wmma = ::nvcuda::wmma;

template <class T>
inline constexpr bool kIs16Bit = std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;
template <class Use>
inline constexpr bool kIsInput = std::is_same_v<Use, wmma::matrix_a> || std::is_same_v<Use, wmma::matrix_b>;
template <class Layout>
inline constexpr bool kIsLayout = std::is_same_v<Layout, wmma::row_major> || std::is_same_v<Layout, wmma::col_major>;

// Which of cuda_sim's fragment mappings a fragment uses.
template <class Use, class Layout>
constexpr int fragment_kind() {
  if constexpr (std::is_same_v<Use, wmma::accumulator>) return 4;
  const int use = std::is_same_v<Use, wmma::matrix_a> ? 0 : 2;
  return use + (std::is_same_v<Layout, wmma::col_major> ? 1 : 0);
}

inline constexpr int kSlotsPerLane = 8;  // 256 elements over 32 lanes, each held once

inline float to_float(float v) { return v; }
inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
inline float to_float(__half v) { return __half2float(v); }

inline int lane_id() {
  const ThreadIndex& t = *tl_thread;
  return int((t.thread_idx.z * t.block_dim.y + t.thread_idx.y) * t.block_dim.x + t.thread_idx.x) % 32;
}

// What a load or a store posts to the rendezvous.
struct MemoryArgs {
  const void* ptr;
  unsigned ldm;
  int layout;  // 0 row-major, 1 column-major
};

// One lane's own check of CUDA's rules for mptr and ldm (sim_wmma.cpp).
void check_memory(const char* what, const std::source_location& where, const void* ptr, unsigned ldm,
                  size_t element_bytes);
// "" if every lane passed lane 0's pointer, ldm and layout, else which lane did not.
std::string same_memory_arguments(void* const* lanes);

template <class T, class LayoutA, class LayoutB>
struct MmaArgs {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float>* d;
  const wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LayoutA>* a;
  const wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LayoutB>* b;
  const wmma::fragment<wmma::accumulator, 16, 16, 16, float>* c;
};

template <class T, class LayoutA, class LayoutB>
std::string run_mma(void* const* lanes) {
  using Args = MmaArgs<T, LayoutA, LayoutB>;
  float a[256], b[256], c[256];
  const uint16_t* map_a = fragment_mapping(fragment_kind<wmma::matrix_a, LayoutA>());
  const uint16_t* map_b = fragment_mapping(fragment_kind<wmma::matrix_b, LayoutB>());
  const uint16_t* map_c = fragment_mapping(fragment_kind<wmma::accumulator, void>());
  for (int l = 0; l < 32; ++l) {
    const auto* args = static_cast<const Args*>(lanes[l]);
    for (int i = 0; i < kSlotsPerLane; ++i) {
      const int slot = l * kSlotsPerLane + i;
      a[map_a[slot]] = to_float(args->a->x[i]);
      b[map_b[slot]] = to_float(args->b->x[i]);
      c[map_c[slot]] = args->c->x[i];
    }
  }
  float d[256];
  for (int r = 0; r < 16; ++r)
    for (int col = 0; col < 16; ++col) {
      float sum = c[r * 16 + col];
      for (int k = 0; k < 16; ++k) sum += a[r * 16 + k] * b[k * 16 + col];  // each product exact
      d[r * 16 + col] = sum;
    }
  for (int l = 0; l < 32; ++l) {
    const auto* args = static_cast<const Args*>(lanes[l]);
    for (int i = 0; i < kSlotsPerLane; ++i) args->d->x[i] = d[map_c[l * kSlotsPerLane + i]];
  }
  return {};
}

}  // namespace llmtrain::cuda_sim::wmma_model

namespace nvcuda::wmma {

template <class Use, int m, int n, int k, class T, class Layout>
class fragment {
  static_assert(m == 16 && n == 16 && k == 16,
                "the simulator's WMMA models the m16n16k16 shape only (fragment<Use, 16, 16, 16, T, Layout>)");
  static_assert(::llmtrain::cuda_sim::wmma_model::kIsInput<Use> || std::is_same_v<Use, accumulator>,
                "a fragment's Use is matrix_a, matrix_b or accumulator");
  static_assert(!std::is_same_v<Use, accumulator> || (std::is_same_v<T, float> && std::is_void_v<Layout>),
                "the simulator's WMMA models float accumulators only, with Layout left void (the layout is "
                "given to load_matrix_sync and store_matrix_sync)");
  static_assert(!::llmtrain::cuda_sim::wmma_model::kIsInput<Use> ||
                    (::llmtrain::cuda_sim::wmma_model::kIs16Bit<T> &&
                     ::llmtrain::cuda_sim::wmma_model::kIsLayout<Layout>),
                "a matrix_a or matrix_b fragment holds __nv_bfloat16 or __half, with Layout row_major or col_major");

 public:
  using element_type = T;
  using storage_element_type = T;
  static constexpr int num_elements = ::llmtrain::cuda_sim::wmma_model::kSlotsPerLane;
  element_type x[num_elements];
};

template <class Use, int m, int n, int k, class T, class Layout>
inline void fill_fragment(fragment<Use, m, n, k, T, Layout>& a, const std::type_identity_t<T>& v) {
  for (int i = 0; i < a.num_elements; ++i) a.x[i] = v;
}

template <class Use, class T, class Layout>
requires ::llmtrain::cuda_sim::wmma_model::kIsInput<Use>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& a, const T* mptr, unsigned ldm,
                             const std::source_location where = std::source_location::current()) {
  using namespace ::llmtrain::cuda_sim;
  using namespace ::llmtrain::cuda_sim::wmma_model;
  constexpr const char* what = "wmma::load_matrix_sync";
  check_memory(what, where, mptr, ldm, sizeof(T));
  constexpr bool col = std::is_same_v<Layout, col_major>;
  // This lane's elements, read now (before the rendezvous: see the header).
  const uint16_t* map = fragment_mapping(fragment_kind<Use, Layout>());
  const int lane = lane_id();
  for (int i = 0; i < kSlotsPerLane; ++i) {
    const int e = map[lane * kSlotsPerLane + i], r = e / 16, c = e % 16;
    a.x[i] = mptr[col ? size_t(c) * ldm + size_t(r) : size_t(r) * ldm + size_t(c)];
  }
  MemoryArgs args{mptr, ldm, col ? 1 : 0};
  warp_whole(what, where, &args, &same_memory_arguments);
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& a, const float* mptr, unsigned ldm,
                             layout_t layout, const std::source_location where = std::source_location::current()) {
  using namespace ::llmtrain::cuda_sim;
  using namespace ::llmtrain::cuda_sim::wmma_model;
  constexpr const char* what = "wmma::load_matrix_sync";
  check_memory(what, where, mptr, ldm, sizeof(float));
  if (layout != mem_row_major && layout != mem_col_major)
    warp_call_failed(what, where,
                     "layout " + std::to_string(int(layout)) + " is neither mem_row_major nor mem_col_major");
  const uint16_t* map = fragment_mapping(fragment_kind<accumulator, void>());
  const int lane = lane_id();
  for (int i = 0; i < kSlotsPerLane; ++i) {
    const int e = map[lane * kSlotsPerLane + i], r = e / 16, c = e % 16;
    a.x[i] = mptr[layout == mem_col_major ? size_t(c) * ldm + size_t(r) : size_t(r) * ldm + size_t(c)];
  }
  MemoryArgs args{mptr, ldm, int(layout)};
  warp_whole(what, where, &args, &same_memory_arguments);
}

inline void store_matrix_sync(float* mptr, const fragment<accumulator, 16, 16, 16, float>& a, unsigned ldm,
                              layout_t layout, const std::source_location where = std::source_location::current()) {
  using namespace ::llmtrain::cuda_sim;
  using namespace ::llmtrain::cuda_sim::wmma_model;
  constexpr const char* what = "wmma::store_matrix_sync";
  check_memory(what, where, mptr, ldm, sizeof(float));
  if (layout != mem_row_major && layout != mem_col_major)
    warp_call_failed(what, where,
                     "layout " + std::to_string(int(layout)) + " is neither mem_row_major nor mem_col_major");
  MemoryArgs args{mptr, ldm, int(layout)};
  warp_whole(what, where, &args, &same_memory_arguments);
  // This lane's elements, written as it leaves (see the header).
  const uint16_t* map = fragment_mapping(fragment_kind<accumulator, void>());
  const int lane = lane_id();
  for (int i = 0; i < kSlotsPerLane; ++i) {
    const int e = map[lane * kSlotsPerLane + i], r = e / 16, c = e % 16;
    mptr[layout == mem_col_major ? size_t(c) * ldm + size_t(r) : size_t(r) * ldm + size_t(c)] = a.x[i];
  }
}

template <class T, class LayoutA, class LayoutB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LayoutA>& a,
                     const fragment<matrix_b, 16, 16, 16, T, LayoutB>& b,
                     const fragment<accumulator, 16, 16, 16, float>& c,
                     const std::source_location where = std::source_location::current()) {
  using namespace ::llmtrain::cuda_sim::wmma_model;
  MmaArgs<T, LayoutA, LayoutB> args{&d, &a, &b, &c};
  ::llmtrain::cuda_sim::warp_whole("wmma::mma_sync", where, &args, &run_mma<T, LayoutA, LayoutB>);
}

}  // namespace nvcuda::wmma
