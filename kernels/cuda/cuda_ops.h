// The CUDA backend's ops: the same signatures as kernels/ops.h, called only by kernels/dispatch.cpp
// after it has checked shapes, dtypes and devices, with every tensor on Device::cuda (copy: one
// side may be on the host). One .cu file per op family in this folder, named as in kernels/cpu/.
// Built by nvcc for a GPU, or by the host compiler against the simulator (kernels/cuda/sim/).
//
// The rule a reader could get wrong: these functions launch work and return; they never read
// device memory on the host (the simulator faults if they do). What the host needs is copied.
#pragma once

#include "kernels/allocator.h"
#include "kernels/ops.h"

namespace llmtrain::kernels::cuda {

// The device allocator (cudaMalloc/cudaFree, every call checked).
Allocator& device_allocator();
void fill_zero(Tensor x);
// Either side on the device or both; host<->host never comes here.
void copy(Tensor out, Tensor in);
// Waits for all work queued on the device (the simulator runs everything in order, at once).
void synchronize();

// The ops of kernels/ops.h that have CUDA kernels (one .cu per op family, kernels/cuda/launch.h).
void convert(Tensor out, Tensor in);
void residual_forward(Tensor out, Tensor a, Tensor b, Tensor bias);
void residual_backward(Tensor dbias, Tensor dout);

}  // namespace llmtrain::kernels::cuda
