// device_select: the rank's device from its local rank (kernels/device_select.h). The arithmetic is
// device_for_rank (pure, tested on its own); the device list comes from cuda_info(), the same
// answer `llmtrain env` and the pre-flight checks give, and the backend makes the choice current.
#include "kernels/device_select.h"

#include <fmt/format.h>

#include <cstdlib>

#include "common/error.h"
#include "kernels/backend_info.h"

namespace llmtrain::kernels {

int device_for_rank(int local_rank, int local_size, int visible, bool share_devices) {
  LT_CHECK(local_size >= 1 && local_rank >= 0 && local_rank < local_size, "local rank {} of {}", local_rank,
           local_size);
  if (visible < 1)
    throw Error(fmt::format("train.device is cuda, but this process sees no CUDA device (local rank {} of {})",
                            local_rank, local_size),
                "run on a machine with an NVIDIA GPU (`llmtrain env` lists what this one has), check "
                "CUDA_VISIBLE_DEVICES, or set train.device: cpu");
  if (local_size > visible && !share_devices)
    throw Error(fmt::format("{} local ranks on this node but {} CUDA device(s) visible to this rank (local rank {}): "
                            "each rank needs a device of its own",
                            local_size, visible, local_rank),
                fmt::format("start at most {} rank(s) per node (launch.procs_per_node), make more devices visible "
                            "(CUDA_VISIBLE_DEVICES), or let ranks share devices with launch.share_devices: true",
                            visible));
  return local_rank % visible;
}

std::string HeldDevice::describe() const {
  const std::string rule = own_devices
                               ? fmt::format("local rank {} of {}, the first of its own {} (srun --gpus-per-task)",
                                             local_rank, local_size, visible)
                               : fmt::format("local rank {} of {} → {} mod {} visible{}", local_rank, local_size,
                                             local_rank, visible, shared ? " (shared: launch.share_devices)" : "");
  return fmt::format("cuda:{} ({}), {}, {}{}{}", ordinal, name, rule,
                     simulator ? "LLMTRAIN_SIM_DEVICES" : "CUDA_VISIBLE_DEVICES", visible_env == "unset" ? " " : "=",
                     visible_env);
}

HeldDevice device_select(int local_rank, int local_size, bool share_devices, int gpus_per_task) {
  const CudaInfo cuda = cuda_info();
  if (!cuda.built)
    throw Error(fmt::format("this build has no CUDA backend: train.device is cuda ({})", cuda.unavailable_reason),
                "build with -DLLMTRAIN_CUDA=ON (a GPU) or SIM (the simulator), or set train.device: cpu");
  if (cuda.devices.empty())
    throw Error(fmt::format("train.device is cuda, but no CUDA device is usable here ({})", cuda.unavailable_reason),
                cuda.simulator ? "set LLMTRAIN_SIM_DEVICES to a whole number of simulated devices, or unset it (1)"
                               : "run on a machine with an NVIDIA GPU (`llmtrain env` lists what this one has), check "
                                 "CUDA_VISIBLE_DEVICES, or set train.device: cpu");
  HeldDevice held;
  held.local_rank = local_rank;
  held.local_size = local_size;
  held.visible = static_cast<int>(cuda.devices.size());
  const bool own_devices = gpus_per_task > 0 && held.visible == gpus_per_task;
  held.own_devices = own_devices;
  held.ordinal = own_devices ? device_for_rank(0, 1, held.visible, share_devices)
                             : device_for_rank(local_rank, local_size, held.visible, share_devices);
  held.shared = !own_devices && local_size > held.visible;
  held.simulator = cuda.simulator;
  held.name = cuda.devices[size_t(held.ordinal)].name;
  const char* env = std::getenv(cuda.simulator ? "LLMTRAIN_SIM_DEVICES" : "CUDA_VISIBLE_DEVICES");
  held.visible_env = env ? env : "unset";
  device_make_current(held.ordinal);
  return held;
}

}  // namespace llmtrain::kernels
