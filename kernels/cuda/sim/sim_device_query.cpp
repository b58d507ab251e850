// cuda_info() in the simulator build (LLMTRAIN_CUDA=SIM): one simulated device, and the words
// that say so wherever devices are listed (`llmtrain env`, pre-flight checks).
#include <cuda_runtime_api.h>

#include "kernels/backend_info.h"

namespace llmtrain::kernels {

CudaInfo cuda_info() {
  CudaInfo c;
  c.built = true;
  c.simulator = true;
  c.built_archs = "simulator";
  c.runtime_version = CUDART_VERSION;
  c.driver_version = 0;
  c.gemm = "llmtrain's tiled GEMM (the simulator has no cuBLASLt)";
  c.devices.push_back({0, "SIMT simulator (kernels/cuda/sim), on the CPU", 0, 0, 0, 1});
  return c;
}

}  // namespace llmtrain::kernels
