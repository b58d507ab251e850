// Built only when this binary has no NCCL (a CPU-only build).
#include "common/error.h"
#include "parallel/comm/comm_libraries.h"
#include "parallel/comm/comm_nccl.h"

namespace llmtrain::parallel {

bool nccl_built() { return false; }
bool nccl_spans_processes() { return false; }
void set_dropped_nccl_handles_fatal(bool) {}
void plant_nccl_abort_on_teardown(bool) {}
int nccl_version_code() { return 0; }
std::string nccl_version() { return "not built (no CUDA backend on a GPU in this build)"; }

std::unique_ptr<Comm> make_nccl_comm(std::unique_ptr<Comm> host) {
  throw Error(fmt::format("group '{}': this build has no NCCL", host->name()),
              "use parallel.device_comm: staged, or a build with the CUDA backend (docs/cuda.md)");
}

}  // namespace llmtrain::parallel
