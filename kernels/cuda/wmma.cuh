// CUDA's WMMA API (warp matrix multiply-accumulate on the tensor cores, namespace nvcuda::wmma) for
// a .cu file: CUDA's own <mma.h> under nvcc, the simulator's model (kernels/cuda/sim/sim_wmma.h)
// under the host compiler. A kernel writes `namespace wmma = nvcuda::wmma;` and CUDA's spelling,
// and the same source builds both ways.
//
// The rule a reader could get wrong: which matrix element a lane's fragment.x[i] holds is not
// specified by CUDA, and the simulator draws it at random at every launch. Touch x[] only
// element-wise (the same operation on every element, or between fragments of the same type);
// anything that needs an element's row or column (a row max, a causal mask) goes through
// store_matrix_sync to shared memory. Loop over num_elements, never a constant. The simulator
// models m16n16k16 with __nv_bfloat16 or __half inputs and float accumulators only.
#pragma once

#include "kernels/cuda/cuda_common.cuh"

#if LLMTRAIN_CUDA_SIMULATOR
#include "kernels/cuda/sim/sim_wmma.h"
#else
#include <mma.h>
#endif
