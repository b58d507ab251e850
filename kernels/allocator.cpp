// The one place that maps a device to its allocator.
#include "kernels/allocator.h"

namespace llmtrain::kernels {

Allocator& allocator_for(Device device) {
  switch (device) {
    case Device::cpu:
      return cpu::host_allocator();
    case Device::cuda:
      break;
  }
  throw Error("not supported yet: allocating CUDA device memory (the CUDA allocator comes with the CUDA backend)",
              "use train.device: cpu");
}

}  // namespace llmtrain::kernels
