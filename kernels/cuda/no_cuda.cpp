// Built only when the CUDA backend is off: the CUDA queries answer "not built", and device memory
// is an error saying so.
#include "common/error.h"
#include "kernels/backend_info.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/device_select.h"

namespace llmtrain::kernels {

CudaInfo cuda_info() {
  CudaInfo c;
  c.built = false;
  c.unavailable_reason = "this build has no CUDA backend (configured with LLMTRAIN_CUDA=OFF or CUDA not found)";
  return c;
}

std::string cuda_attention_kernel(DType, int64_t) { return "none (this build has no CUDA backend)"; }

[[noreturn]] static void no_device() {
  throw Error("this build has no CUDA backend: it cannot hold a CUDA device",
              "use train.device: cpu, or build with the CUDA backend (cmake -DLLMTRAIN_CUDA=ON, or -DLLMTRAIN_CUDA=SIM "
              "for the simulator)");
}

void device_make_current(int) { no_device(); }
int device_current() { no_device(); }

namespace cuda {

Allocator& device_allocator() {
  throw Error("not supported yet: CUDA device memory in this build (it has no CUDA backend)",
              "use train.device: cpu, or build with the CUDA backend (cmake -DLLMTRAIN_CUDA=ON on a machine with "
              "the CUDA toolkit, or -DLLMTRAIN_CUDA=SIM for the simulator)");
}

}  // namespace cuda

}  // namespace llmtrain::kernels
