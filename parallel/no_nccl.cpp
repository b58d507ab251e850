// Built only when the CUDA backend is off.
#include "parallel/comm_libraries.h"

namespace llmtrain::parallel {

std::string nccl_version() { return "not built (CPU-only build)"; }

}  // namespace llmtrain::parallel
