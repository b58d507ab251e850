// The SIMT simulator: what a .cu file sees of CUDA when the host compiler builds it
// (cmake -DLLMTRAIN_CUDA=SIM). Kernels include kernels/cuda/cuda_common.cuh, never this header.
//
// The model (docs/cuda.md): a launch runs its blocks one after another on the calling OS thread;
// the threads of a block run concurrently as fibers (one small stack each) that switch only at
// __syncthreads, __syncwarp, the warp collectives (shuffles, votes) and the whole-warp operations
// WMMA is built on (kernels/cuda/sim/sim_wmma.h, via kernels/cuda/wmma.cuh). A barrier releases when
// every thread of the block that has not exited has arrived; a warp collective is a rendezvous of
// exactly the lanes its mask names, which exchange values when the last one arrives. Shared memory
// is per block: `__shared__` variables are thread_local (block scope makes them static) and the
// dynamic shared memory (LT_DYNAMIC_SHARED) is a per-launch area filled with 0xFF bytes (NaN for
// floats) before every block, 16-byte aligned and never 32 (more than 48 KiB of it needs the
// kernel's cudaFuncSetAttribute opt-in, as in CUDA). Device memory (cudaMalloc) is mapped without
// access except while a kernel or a copy runs, so a host read of it faults.
//
// The rule a reader could get wrong: a kernel that is wrong under CUDA's rules must be wrong here
// too, not happen to work. A missing __syncthreads lets a thread read shared memory before another
// thread of its block wrote it (threads run until they block: in index order on even blocks and
// passes, in reverse on odd ones); a shuffle that names a lane outside its mask, a mask that names
// an exited lane or a lane that does not exist, a WMMA call not made by all 32 lanes with the same
// arguments, and a block whose threads wait on each other forever abort the process with a message
// saying so; WMMA fragments map elements to lanes differently at every launch.
#pragma once

#if defined(__CUDACC__)
#error "kernels/cuda/sim/sim.h is for the host compiler; nvcc uses the CUDA runtime"
#endif

// CUDA's own headers: the runtime API's types and declarations (the simulator defines the subset
// it implements, kernels/cuda/sim/sim_runtime.cpp), dim3/uint3, and the bf16/fp16 types, which
// NVIDIA's headers define for host compilers too.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <source_location>
#include <string>
#include <type_traits>

// Qualifiers: crt/host_defines.h maps __device__, __global__, __host__ to nothing and
// __forceinline__ to always_inline for a host compiler; __shared__ becomes per-OS-thread storage
// (the fibers of a block share their OS thread; blocks run one at a time on it).
#undef __shared__
#define __shared__ thread_local
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#ifndef __constant__
#define __constant__
#endif

namespace llmtrain::cuda_sim {

// One simulated thread's built-in variables.
struct ThreadIndex {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};

// The fiber running on this OS thread (null outside a kernel).
extern constinit thread_local ThreadIndex* tl_thread;

void syncthreads();
// The warp collectives, one entry point: every lane of `mask` calls it with the same op and
// mask; `arg` is the lane (idx), delta (up, down), lane mask (xor) or predicate (votes).
enum class WarpOp : uint8_t { sync, shfl_idx, shfl_up, shfl_down, shfl_xor, ballot, any, all };
uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int arg, int width, const char* what);
// LT_DEVICE_CHECK's failure: prints where, which thread and the message, and aborts.
[[noreturn]] void device_check_failed(const char* file, int line, const char* cond, const char* format, ...)
    __attribute__((format(printf, 4, 5)));
// This block's dynamic shared memory (the launch's `smem` bytes): 16-byte aligned, as CUDA promises,
// and never 32-byte aligned, so a kernel that needs more (WMMA's 32 bytes) must round it up.
void* dynamic_shared_memory();

// A whole-warp operation (the WMMA model, kernels/cuda/sim/sim_wmma.h): all 32 lanes of the calling
// thread's warp call it, converged, with the same `what`, `where` and `run`, `args` pointing at the
// lane's own arguments. The last lane to arrive calls run(lanes), lanes[l] being lane l's `args`
// (fibers share one address space: it may read and write every lane's fragments), then every lane
// goes on. `run` returns "" or why the lanes' arguments are wrong. A lane that has exited, a warp of
// fewer than 32 threads, lanes at different calls and a non-empty answer from `run` abort naming the
// call; a lane that waits elsewhere leaves the block in the deadlock report.
using WarpFunction = std::string (*)(void* const* lanes);
void warp_whole(const char* what, const std::source_location& where, void* args, WarpFunction run);
// Aborts naming the block, the calling thread, the call `what` at `where`, and `why`.
[[noreturn]] void warp_call_failed(const char* what, const std::source_location& where, const std::string& why);
// The running launch's mapping of fragment slots to matrix elements for fragment kind `kind` (0 to
// kFragmentKinds - 1): lane l's x[i] holds element mapping[l * 8 + i] (row * 16 + column) of the 16×16
// tile. A fresh random permutation per kind at every launch, seeded by the launch's number on this
// OS thread (reproducible), so that a kernel assuming a layout CUDA does not promise is wrong.
inline constexpr int kFragmentKinds = 5;
const uint16_t* fragment_mapping(int kind);

// A kernel launch: checks the configuration (a bad one sets the error cudaGetLastError returns, as
// CUDA does, and queues nothing), then queues the grid on `config.stream`
// (kernels/cuda/sim/sim_streams.cpp): when the stream's work runs, `thread_body` runs once for
// every thread of every block.
struct LaunchConfig {
  dim3 grid;
  dim3 block;
  size_t smem = 0;
  cudaStream_t stream = nullptr;
  const char* name = "";
  const void* func = nullptr;  // the kernel: its attributes (cudaFuncSetAttribute) apply
};
void launch(const LaunchConfig& config, std::function<void()> thread_body);

template <class Kernel>
struct Launcher {
  LaunchConfig config;
  Kernel kernel;
  template <class... Args>
  void operator()(Args&&... args) const {
    // A kernel's parameters are by value: the arguments are copied at the launch, and each thread
    // receives its own copies of those when the grid runs, later (streams are asynchronous).
    LaunchConfig c = config;
    c.func = reinterpret_cast<const void*>(kernel);
    launch(c, [kernel = kernel, ... a = std::decay_t<Args>(std::forward<Args>(args))] { kernel(a...); });
  }
};

template <class T>
inline uint64_t to_bits(T v) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "warp shuffles move at most 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <class T>
inline T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

}  // namespace llmtrain::cuda_sim

#define LT_SIM_LAUNCH(grid, block, smem, stream, ...)                                                             \
  ::llmtrain::cuda_sim::Launcher<decltype(&__VA_ARGS__)> {                                                        \
    ::llmtrain::cuda_sim::LaunchConfig{dim3(grid), dim3(block), size_t(smem), stream, #__VA_ARGS__}, &__VA_ARGS__ \
  }

// cudaFuncSetAttribute(kernel, attribute, value) as CUDA's cuda_runtime.h spells it for a kernel
// (the runtime API's form takes a const void*; kernels/cuda/sim/sim_runtime.cpp implements it).
template <class Kernel>
requires std::is_function_v<Kernel>
inline cudaError_t cudaFuncSetAttribute(Kernel* entry, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(entry), attr, value);
}

#define threadIdx (::llmtrain::cuda_sim::tl_thread->thread_idx)
#define blockIdx (::llmtrain::cuda_sim::tl_thread->block_idx)
#define blockDim (::llmtrain::cuda_sim::tl_thread->block_dim)
#define gridDim (::llmtrain::cuda_sim::tl_thread->grid_dim)
inline constexpr int warpSize = 32;

// CUDA's device functions as the simulator provides them. It implements a subset of CUDA's API,
// not only what our kernels call today: __shfl_sync, __shfl_up_sync, __shfl_down_sync,
// __ballot_sync and the atomics are used so far only by the simulator's own test kernels
// (tests/kernels/sim/), which check that each behaves as CUDA specifies before a kernel relies on it.
inline void __syncthreads() { ::llmtrain::cuda_sim::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::llmtrain::cuda_sim::warp_collective(::llmtrain::cuda_sim::WarpOp::sync, mask, 0, 0, warpSize, "__syncwarp");
}

template <class T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
  using namespace ::llmtrain::cuda_sim;
  return from_bits<T>(warp_collective(WarpOp::shfl_idx, mask, to_bits(var), src_lane, width, "__shfl_sync"));
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  using namespace ::llmtrain::cuda_sim;
  return from_bits<T>(warp_collective(WarpOp::shfl_up, mask, to_bits(var), int(delta), width, "__shfl_up_sync"));
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  using namespace ::llmtrain::cuda_sim;
  return from_bits<T>(warp_collective(WarpOp::shfl_down, mask, to_bits(var), int(delta), width, "__shfl_down_sync"));
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
  using namespace ::llmtrain::cuda_sim;
  return from_bits<T>(warp_collective(WarpOp::shfl_xor, mask, to_bits(var), lane_mask, width, "__shfl_xor_sync"));
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  using namespace ::llmtrain::cuda_sim;
  return unsigned(warp_collective(WarpOp::ballot, mask, predicate != 0, 0, warpSize, "__ballot_sync"));
}
inline int __any_sync(unsigned mask, int predicate) {
  using namespace ::llmtrain::cuda_sim;
  return int(warp_collective(WarpOp::any, mask, predicate != 0, 0, warpSize, "__any_sync"));
}
inline int __all_sync(unsigned mask, int predicate) {
  using namespace ::llmtrain::cuda_sim;
  return int(warp_collective(WarpOp::all, mask, predicate != 0, 0, warpSize, "__all_sync"));
}

// Atomics. Fibers switch only at barriers and warp collectives, so a read-modify-write is never
// interleaved within a block; the __atomic builtins also keep it atomic if blocks ever run on
// several OS threads.
namespace llmtrain::cuda_sim {
template <class T, class F>
inline T atomic_update(T* address, F f) {
  if constexpr (std::is_integral_v<T>) {
    T old = __atomic_load_n(address, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(address, &old, f(old), false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
  } else {
    using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
    U* word = reinterpret_cast<U*>(address);
    U old = __atomic_load_n(word, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(word, &old, from_bits<U>(to_bits(f(from_bits<T>(old)))), false,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return from_bits<T>(old);
  }
}
}  // namespace llmtrain::cuda_sim

inline float atomicAdd(float* a, float v) {
  return ::llmtrain::cuda_sim::atomic_update(a, [v](float x) { return x + v; });
}
inline double atomicAdd(double* a, double v) {
  return ::llmtrain::cuda_sim::atomic_update(a, [v](double x) { return x + v; });
}
inline int atomicAdd(int* a, int v) { return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); }
inline unsigned atomicAdd(unsigned* a, unsigned v) { return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); }
inline unsigned long long atomicAdd(unsigned long long* a, unsigned long long v) {
  return __atomic_fetch_add(a, v, __ATOMIC_RELAXED);
}
inline int atomicSub(int* a, int v) { return __atomic_fetch_sub(a, v, __ATOMIC_RELAXED); }
inline unsigned atomicSub(unsigned* a, unsigned v) { return __atomic_fetch_sub(a, v, __ATOMIC_RELAXED); }
inline int atomicMax(int* a, int v) {
  return ::llmtrain::cuda_sim::atomic_update(a, [v](int x) { return x > v ? x : v; });
}
inline unsigned atomicMax(unsigned* a, unsigned v) {
  return ::llmtrain::cuda_sim::atomic_update(a, [v](unsigned x) { return x > v ? x : v; });
}
inline int atomicMin(int* a, int v) {
  return ::llmtrain::cuda_sim::atomic_update(a, [v](int x) { return x < v ? x : v; });
}
inline unsigned atomicMin(unsigned* a, unsigned v) {
  return ::llmtrain::cuda_sim::atomic_update(a, [v](unsigned x) { return x < v ? x : v; });
}
template <class T>
inline T atomicCAS(T* a, T compare, T value) {
  static_assert(std::is_same_v<T, int> || std::is_same_v<T, unsigned> || std::is_same_v<T, unsigned long long>);
  __atomic_compare_exchange_n(a, &compare, value, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return compare;  // the old value: unchanged when the exchange happened, the found one otherwise
}
template <class T>
inline T atomicExch(T* a, T value) {
  if constexpr (std::is_integral_v<T>) {
    return __atomic_exchange_n(a, value, __ATOMIC_RELAXED);
  } else {
    return ::llmtrain::cuda_sim::atomic_update(a, [value](T) { return value; });
  }
}

// Device math that host libm lacks (the fast intrinsics are their accurate versions here).
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline unsigned __float_as_uint(float x) {
  return ::llmtrain::cuda_sim::from_bits<unsigned>(::llmtrain::cuda_sim::to_bits(x));
}
inline float __uint_as_float(unsigned x) {
  return ::llmtrain::cuda_sim::from_bits<float>(::llmtrain::cuda_sim::to_bits(x));
}
inline int __float_as_int(float x) { return ::llmtrain::cuda_sim::from_bits<int>(::llmtrain::cuda_sim::to_bits(x)); }
inline float __int_as_float(int x) { return ::llmtrain::cuda_sim::from_bits<float>(::llmtrain::cuda_sim::to_bits(x)); }
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
