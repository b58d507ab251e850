// The CUDA kernels' host entry points, in plain types: the .cu files define them, and
// kernels/cuda/cuda_ops.cpp calls them with what it unpacks from Tensors (the .cu files include
// nothing that uses fmt, which nvcc's front end rejects). Every launcher queues work on the
// default stream and returns; cuda_ops.cpp checks the launch.
//
// The rule a reader could get wrong: the pointers are device memory, and every float pointer of
// one call has the call's Storage (the fp32 statistics excepted, typed float* here).
#pragma once

#include <cstdint>

namespace llmtrain::kernels::cuda {

// A float tensor's dtype, as the kernels see it.
enum class Storage : uint8_t { fp32, bf16, fp16 };

// convert.cu
void convert_launch(void* out, Storage out_storage, const void* in, Storage in_storage, int64_t n);

// residual.cu: out [n, c] = a + b (+ bias [c]); dbias [c] += column sums of dout [n, c].
void residual_forward_launch(Storage s, void* out, const void* a, const void* b, const void* bias, int64_t n,
                             int64_t c);
void residual_backward_launch(Storage s, void* dbias, const void* dout, int64_t n, int64_t c);

}  // namespace llmtrain::kernels::cuda
