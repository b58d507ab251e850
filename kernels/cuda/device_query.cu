// CUDA device discovery for `llmtrain env` and pre-flight checks. Never throws: a machine
// without a driver or GPU is normal (CI), and is reported as a reason string.
#include <cuda_runtime.h>

#include <exception>

#include "kernels/backend_info.h"
#include "kernels/cuda/cublaslt.h"
#include "llmtrain_version.h"

namespace llmtrain::kernels {

CudaInfo cuda_info() {
  CudaInfo c;
  c.built = true;
  c.built_archs = LLMTRAIN_CUDA_ARCHS;
  try {
    c.gemm = cuda::gemm_backend_name();
  } catch (const std::exception& e) {
    c.gemm = e.what();
  }
  cudaRuntimeGetVersion(&c.runtime_version);
  if (cudaDriverGetVersion(&c.driver_version) != cudaSuccess) c.driver_version = 0;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    c.unavailable_reason = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky error state
    return c;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    c.devices.push_back({i, p.name, p.major, p.minor, p.totalGlobalMem, p.multiProcessorCount});
  }
  if (c.devices.empty()) c.unavailable_reason = "no CUDA devices visible";
  return c;
}

}  // namespace llmtrain::kernels
