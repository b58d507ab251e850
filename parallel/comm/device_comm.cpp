#include "parallel/comm/device_comm.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "common/strings.h"
#include "parallel/comm/comm.h"
#include "parallel/comm/comm_libraries.h"
#include "parallel/comm/comm_nccl.h"

extern char** environ;

namespace llmtrain::parallel {
namespace {

bool multi_rank_gpu_enabled() {
  const char* v = std::getenv("NCCL_MULTI_RANK_GPU_ENABLE");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace

const char* to_string(DeviceComm c) { return c == DeviceComm::nccl ? "nccl" : "staged"; }

DeviceCommChoice choose_device_comm(std::optional<DeviceComm> requested, bool shares_gpu, bool across_processes) {
  if (requested == DeviceComm::staged) return {DeviceComm::staged, "parallel.device_comm: staged"};
  const bool explicit_nccl = requested == DeviceComm::nccl;
  if (!nccl_built()) {
    if (explicit_nccl)
      throw Error("parallel.device_comm: nccl, but this build has no NCCL (a CPU-only or simulator build)",
                  "use device_comm: auto or staged, or build with the CUDA backend on a machine with NCCL "
                  "(docs/cuda.md)");
    return {DeviceComm::staged, "auto: this build has no NCCL"};
  }
  if (across_processes && !nccl_spans_processes()) {
    const std::string why = "the simulator's NCCL joins only ranks that are threads of one process";
    if (explicit_nccl)
      throw Error("parallel.device_comm: nccl, but " + why + " (these ranks are processes)",
                  "use device_comm: auto or staged on the simulator; ranks as threads (tests/bench/ranks_in_process) "
                  "take its NCCL");
    return {DeviceComm::staged, "auto: " + why};
  }
  const std::string version = "NCCL " + nccl_version();
  if (shares_gpu && (nccl_version_code() < kNcclMultiRankGpuVersion || !multi_rank_gpu_enabled())) {
    const std::string why =
        nccl_version_code() < kNcclMultiRankGpuVersion
            ? fmt::format(
                  "ranks share a GPU and {} refuses several ranks of a communicator on one GPU (2.30 "
                  "and later accept them with NCCL_MULTI_RANK_GPU_ENABLE=1)",
                  version)
            : fmt::format(
                  "ranks share a GPU and NCCL_MULTI_RANK_GPU_ENABLE is not 1 ({} needs it to put "
                  "several ranks of a communicator on one GPU)",
                  version);
    if (explicit_nccl)
      throw Error("parallel.device_comm: nccl, but " + why,
                  "use device_comm: auto (which takes the staged path here), give each rank its own GPU, or set "
                  "NCCL_MULTI_RANK_GPU_ENABLE=1 with NCCL 2.30 or later");
    return {DeviceComm::staged, "auto: " + why};
  }
  return {DeviceComm::nccl, version};
}

std::optional<DeviceComm> requested_device_comm(DeviceCommKind kind) {
  switch (kind) {
    case DeviceCommKind::nccl:
      return DeviceComm::nccl;
    case DeviceCommKind::staged:
      return DeviceComm::staged;
    case DeviceCommKind::automatic:
      break;
  }
  return std::nullopt;
}

DeviceCommChoice agree_device_comm(std::optional<DeviceComm> requested, bool shares_gpu, bool across_processes,
                                   Comm& world) {
  DeviceCommChoice choice = choose_device_comm(requested, shares_gpu, across_processes);
  int32_t staged = choice.comm == DeviceComm::staged ? 1 : 0;
  world.all_reduce(kernels::Tensor(&staged, kernels::DType::int32, {1}), ReduceOp::max);
  if (staged == 1 && choice.comm == DeviceComm::nccl)
    choice = {DeviceComm::staged, "auto: another rank cannot use NCCL (its log says why)"};
  return choice;
}

std::string nccl_settings() {
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e)
    if (std::strncmp(*e, "NCCL_", 5) == 0) out.push_back(printable(*e));
  std::sort(out.begin(), out.end());
  std::string text;
  for (const std::string& s : out) text += (text.empty() ? "" : " ") + s;
  return text;
}

}  // namespace llmtrain::parallel
