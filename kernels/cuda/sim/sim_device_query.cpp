// cuda_info() in the simulator build (LLMTRAIN_CUDA=SIM): LLMTRAIN_SIM_DEVICES simulated devices
// (one by default; kernels/cuda/sim/sim_devices.h), and the words that say so wherever devices are
// listed (`llmtrain env`, pre-flight checks, the device a rank holds). A malformed
// LLMTRAIN_SIM_DEVICES leaves the list empty with the reason.
#include <cuda_runtime_api.h>

#include <exception>

#include "kernels/backend_info.h"
#include "kernels/cuda/cublaslt.h"
#include "kernels/cuda/sim/sim_devices.h"

namespace llmtrain::kernels {

CudaInfo cuda_info() {
  CudaInfo c;
  c.built = true;
  c.simulator = true;
  c.built_archs = "simulator";
  c.runtime_version = CUDART_VERSION;
  c.driver_version = 0;
  try {
    c.gemm = cuda::gemm_backend_name();
  } catch (const std::exception& e) {
    c.gemm = e.what();
  }
  const cuda_sim::SimDevices sim = cuda_sim::sim_devices();
  c.unavailable_reason = sim.error;
  for (int i = 0; i < sim.count; ++i)
    c.devices.push_back({i, "SIMT simulator (kernels/cuda/sim), on the CPU", 0, 0, 0, 1});
  return c;
}

}  // namespace llmtrain::kernels
