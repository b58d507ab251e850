// Allocator: where owning memory comes from, one per device. Buffers (kernels/buffer.h) are the
// only users; everything else works on Tensor views into buffers.
//
// Rule a reader could get wrong: allocator_for(Device::cuda) is the CUDA backend's allocator
// (kernels/cuda/runtime.cu, on a GPU or the simulator). In a build without that backend, asking
// for device memory is an llmtrain::Error saying so, never a silent fallback to host memory.
#pragma once

#include <cstddef>

#include "kernels/tensor.h"

namespace llmtrain::kernels {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  // At least `bytes` bytes (aligned to kAlignment), or throws llmtrain::Error. 0 bytes gives a
  // valid pointer to nothing.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p, size_t bytes) noexcept = 0;
};

// Host memory is 64-byte aligned: a cache line and an AVX-512 vector.
inline constexpr size_t kAlignment = 64;

// The process-wide allocator of a device.
Allocator& allocator_for(Device device);

namespace cpu {
Allocator& host_allocator();
}

}  // namespace llmtrain::kernels
