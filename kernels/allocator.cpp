// The one place that maps a device to its allocator.
#include "kernels/allocator.h"

#include "common/error.h"
#include "kernels/cuda/cuda_ops.h"

namespace llmtrain::kernels {

Allocator& allocator_for(Device device) {
  switch (device) {
    case Device::cpu:
      return cpu::host_allocator();
    case Device::cuda:
      return cuda::device_allocator();
  }
  LT_CHECK(false, "allocator_for: unknown device {}", int(device));
  __builtin_unreachable();
}

}  // namespace llmtrain::kernels
