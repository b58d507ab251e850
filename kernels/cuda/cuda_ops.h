// The CUDA backend's ops: every op of the table (kernels/op_table.def) with its signature, called
// only by kernels/dispatch.cpp after it has checked shapes, dtypes and devices, with every tensor
// on Device::cuda. Each op family's entry points sit in its .cu file beside its kernels, named as
// in kernels/cpu/ (fill_zero in runtime.cpp); built by nvcc for a GPU, or by the host compiler
// against the simulator (kernels/cuda/sim/).
//
// The rule a reader could get wrong: these functions launch work and return; they never read
// device memory on the host (the simulator faults if they do). What the host needs is copied.
// This header and what it includes stay free of fmt, which nvcc's front end cannot compile.
#pragma once

#include "kernels/allocator.h"
#include "kernels/ops.h"

namespace llmtrain::kernels::cuda {

#define LT_OP LT_OP_DECLARE
#include "kernels/op_table.def"
#undef LT_OP

// The device allocator (cudaMalloc/cudaFree, every call checked).
Allocator& device_allocator();
// Either side on the device or both; host<->host never comes here.
void copy(Tensor out, Tensor in);
// Waits for all work queued on the device (the simulator runs everything in order, at once).
void synchronize();

}  // namespace llmtrain::kernels::cuda
