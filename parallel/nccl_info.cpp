#include <fmt/format.h>
#include <nccl.h>

#include "parallel/comm_libraries.h"

namespace llmtrain::parallel {

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown (ncclGetVersion failed)";
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return fmt::format("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100);
}

}  // namespace llmtrain::parallel
