// Built only when the CUDA backend is off.
#include "parallel/backend_info.h"

namespace llmtrain::parallel {

std::string nccl_version() { return "not built (CPU-only build)"; }

}  // namespace llmtrain::parallel
