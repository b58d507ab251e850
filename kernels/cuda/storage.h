// What the CUDA entry points (kernels/cuda/*.cu, kernels/cuda/cuda_ops.h) share on the host side:
// the storage dtypes a kernel is instantiated for, a tensor's storage and typed data, and device
// scratch. Plain C++ without fmt, so that nvcc can compile every .cu file that includes it (the
// functions that format messages are defined in kernels/cuda/runtime.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/tensor.h"

namespace llmtrain::kernels::cuda {

// A float tensor's dtype, as the kernels see it.
enum class Storage : uint8_t { fp32, bf16, fp16 };

// The storage of a float tensor; any other dtype is a broken invariant (the dispatch checked it).
Storage storage_of(const Tensor& t);

// A tensor's device memory as the kernel's element type (null for an absent optional tensor).
// Unchecked: the dispatch checked the dtypes, and the caller picked T from storage_of.
template <class T>
T* data(const Tensor& t) {
  return static_cast<T*>(t.data);
}

// The stream every op's work goes on: non-blocking (not ordered with the legacy default stream), on
// the device this rank holds. One per process, created at first use, unless the calling thread has
// one of its own (kernels::ThreadComputeStream: ranks that are threads of one process). Communication
// runs on its own streams, ordered against this one by events (kernels/device_stream.h).
cudaStream_t compute_stream();
// Makes `stream` the calling thread's compute stream (null: the process's again); returns the one
// it replaces.
cudaStream_t exchange_thread_compute_stream(cudaStream_t stream);

// Device scratch of this host thread, grown to its high-water mark once (ops allocate nothing per
// call after that); `slot` (0 or 1) keeps users that live at the same time apart.
void* device_scratch(int slot, size_t bytes);

// Throws the user's llmtrain::Error "not supported yet: <what>" with a hint (for limits of a
// kernel, such as attention's largest head dim).
[[noreturn]] void not_supported(const std::string& what, const std::string& hint);

}  // namespace llmtrain::kernels::cuda
