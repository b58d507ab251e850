// What every .cu file includes first: CUDA itself under nvcc, the SIMT simulator
// (kernels/cuda/sim/sim.h) under the host compiler (cmake -DLLMTRAIN_CUDA=SIM). The kernels' source
// is the same for both; docs/cuda.md lists what a kernel may use so that it stays simulatable.
//
// The rule a reader could get wrong: launch with LT_LAUNCH and take dynamic shared memory with
// LT_DYNAMIC_SHARED, never `<<<...>>>` or `extern __shared__` directly; those two are the only
// spellings the simulator cannot provide as CUDA writes them.
#pragma once

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#define LLMTRAIN_CUDA_SIMULATOR 0
#include <cstdio>
// LT_DEVICE_CHECK(cond, "printf format", args...): a broken invariant inside a kernel (a token id
// outside the vocabulary). The kernel prints and traps; the next CUDA call fails with a launch
// error, which its LT_CUDA check reports. In the simulator: the message and abort.
#define LT_DEVICE_CHECK(cond, ...)                                           \
  do {                                                                       \
    if (!(cond)) {                                                           \
      printf("%s:%d: kernel check failed: %s: ", __FILE__, __LINE__, #cond); \
      printf(__VA_ARGS__);                                                   \
      printf("\n");                                                          \
      __trap();                                                              \
    }                                                                        \
  } while (0)
// LT_LAUNCH(grid, block, shared_bytes, stream, kernel)(args...): the kernel comes last so that a
// template kernel's commas need no parentheses.
#define LT_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<(grid), (block), (smem), (stream)>>>
// LT_DYNAMIC_SHARED(float, buf): `buf` points at this block's dynamic shared memory (the launch's
// shared_bytes), 16-byte aligned.
// LT_UNROLL before a loop of compile-time trip count: unrolled by nvcc (so arrays indexed by its
// counter stay in registers); nothing in the simulator.
#define LT_UNROLL _Pragma("unroll")
#define LT_UNROLL_BY(n) _Pragma(LT_STRINGIFY(unroll n))
#define LT_STRINGIFY(x) #x
#define LT_DYNAMIC_SHARED(T, name)                                   \
  extern __shared__ __align__(16) unsigned char name##_lt_dynamic[]; \
  T* name = reinterpret_cast<T*>(name##_lt_dynamic)
#else
#include "kernels/cuda/sim/sim.h"
#define LLMTRAIN_CUDA_SIMULATOR 1
#define LT_LAUNCH(grid, block, smem, stream, ...) LT_SIM_LAUNCH(grid, block, smem, stream, __VA_ARGS__)
#define LT_DYNAMIC_SHARED(T, name) T* name = static_cast<T*>(::llmtrain::cuda_sim::dynamic_shared_memory())
#define LT_UNROLL
#define LT_UNROLL_BY(n)
#define LT_DEVICE_CHECK(cond, ...)                                                                  \
  do {                                                                                              \
    if (!(cond)) ::llmtrain::cuda_sim::device_check_failed(__FILE__, __LINE__, #cond, __VA_ARGS__); \
  } while (0)
#endif
