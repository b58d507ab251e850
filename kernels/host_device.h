// LT_HOST_DEVICE: a small inline function that both backends compile, the CPU ops (kernels/cpu/) and
// the CUDA kernels (kernels/cuda/*.cu): __host__ __device__ under nvcc, plain inline for the host
// compiler, which is also what builds the .cu files against the simulator (there __device__ means
// nothing). Such a function is where maths the two backends must agree on is written once.
//
// The rule a reader could get wrong: a header of LT_HOST_DEVICE functions is included by .cu files,
// so it includes only the standard library's maths headers, never fmt or a header that uses it
// (docs/cuda.md, "Restrictions for kernels"), and its functions call only what the device has too
// (expf, logf: no std::max, no std::vector, no LT_CHECK).
#pragma once

#if defined(__CUDACC__)
#define LT_HOST_DEVICE __host__ __device__ inline
#else
#define LT_HOST_DEVICE inline
#endif
