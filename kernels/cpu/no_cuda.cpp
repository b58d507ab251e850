// Built only when the CUDA backend is off: the CUDA queries answer "not built".
#include "kernels/backend_info.h"

namespace llmtrain::kernels {

CudaInfo cuda_info() {
  CudaInfo c;
  c.built = false;
  c.unavailable_reason = "this build has no CUDA backend (configured with LLMTRAIN_CUDA=OFF or CUDA not found)";
  return c;
}

}  // namespace llmtrain::kernels
