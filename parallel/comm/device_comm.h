// Which communicator moves a cuda rank's device memory (parallel.device_comm): NCCL, or the staged
// communicator (device -> pinned host -> MPI -> device, parallel/comm/comm_staged.h).
//
// Rules a reader could get wrong:
//  - auto takes NCCL when the build has it and NCCL can serve the layout; otherwise it takes the
//    staged path and says why (no NCCL in this build, or ranks sharing a GPU with an NCCL that
//    refuses that). An explicit nccl that cannot work is an error, never a silent staged run.
//  - Several ranks of one NCCL communicator on one GPU need NCCL >= 2.30 and
//    NCCL_MULTI_RANK_GPU_ENABLE=1 in the ranks' environment (NCCL_* settings reach the ranks,
//    launcher/launch_plan.cpp); older NCCL fails with "Duplicate GPU detected".
//  - Every rank must end with the same choice: the caller agrees on it over the world (a rank that
//    must stage makes every rank stage).
#pragma once

#include <optional>
#include <string>

#include "common/recipe/recipe.h"

namespace llmtrain::parallel {

enum class DeviceComm { staged, nccl };
const char* to_string(DeviceComm c);

struct DeviceCommChoice {
  DeviceComm comm = DeviceComm::staged;
  std::string why;  // "NCCL 2.28.9", "parallel.device_comm: staged", "auto: this build has no NCCL"
};

// `requested`: nccl or staged as the recipe says, nullopt for auto. `shares_gpu`: this rank's GPU
// is shared with other ranks (launch.share_devices). `across_processes`: the ranks are processes
// (mpirun, srun), not threads of one process (the in-process runner): the simulator's NCCL serves
// only the latter. Throws llmtrain::Error (a user error naming parallel.device_comm) when nccl is
// requested and cannot work.
DeviceCommChoice choose_device_comm(std::optional<DeviceComm> requested, bool shares_gpu, bool across_processes = true);

// parallel.device_comm as a request: nullopt for auto.
std::optional<DeviceComm> requested_device_comm(DeviceCommKind kind);

class Comm;
// This rank's choice, agreed over `world` (collective): a rank that must stage (its GPU shared with
// an NCCL that refuses that) makes every rank stage.
DeviceCommChoice agree_device_comm(std::optional<DeviceComm> requested, bool shares_gpu, bool across_processes,
                                   Comm& world);

// The NCCL_* variables of this process's environment, "NAME=value" each, sorted; values made
// printable (for `llmtrain env` and the run log).
std::string nccl_settings();

}  // namespace llmtrain::parallel
