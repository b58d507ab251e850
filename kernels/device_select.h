// Which CUDA device a rank holds (docs/cuda.md "Which device a rank holds"): device
// `local_rank mod visible`, among the devices this process sees (CUDA_VISIBLE_DEVICES honoured).
// More local ranks than visible devices is refused unless launch.share_devices lets them share.
// A rank whose devices are its own (srun --gpus-per-task gave each task its GPU, and the task sees
// only that one) shares them with no other rank: it takes device 0.
//
// The rule a reader could get wrong: cudaSetDevice is per host thread. device_select makes the
// device current on the thread that calls it (the rank's main thread, which launches every kernel
// and makes every allocation); any other thread that touches the device must call
// device_make_current(held.ordinal) first, or it works on device 0.
#pragma once

#include <string>

namespace llmtrain::kernels {

// The pure rule: the ordinal of the device a rank with `local_rank` of `local_size` ranks on its
// node takes among `visible` devices. Throws llmtrain::Error when no device is visible, and when
// local_size > visible unless `share_devices` (the message names both counts and the way out).
int device_for_rank(int local_rank, int local_size, int visible, bool share_devices);

struct HeldDevice {
  int ordinal = -1;  // among the visible devices (cudaSetDevice's argument)
  int visible = 0;   // devices this process sees
  int local_rank = 0, local_size = 1;
  std::string name;          // "NVIDIA H100 80GB HBM3"
  std::string visible_env;   // CUDA_VISIBLE_DEVICES, "unset" when it is not set
  bool shared = false;       // local_size > visible (launch.share_devices)
  bool simulator = false;    // the SIMT simulator's devices (LLMTRAIN_SIM_DEVICES)
  bool own_devices = false;  // the visible devices are this rank's alone (srun --gpus-per-task)

  // "cuda:1 (NVIDIA H100 80GB HBM3), local rank 1 of 2 → 1 mod 2 visible, CUDA_VISIBLE_DEVICES=2,3"
  std::string describe() const;
};

// Called once per rank at start-up, before any CUDA allocation (and before a device communicator
// is made): reads this process's visible devices, applies device_for_rank, makes the device
// current on the calling thread and says which it is. Throws llmtrain::Error when the build has no
// CUDA backend, no device is usable, or the local ranks outnumber the devices. `gpus_per_task` > 0
// (parallel::LaunchEnv::gpus_per_task, srun --gpus-per-task): when this rank sees exactly that many
// devices they are its own, bound to it, and it takes the first; when it sees more (no binding),
// the rule above applies.
HeldDevice device_select(int local_rank, int local_size, bool share_devices, int gpus_per_task = 0);

// The CUDA backend's half (kernels/cuda/runtime.cpp; kernels/cuda/no_cuda.cpp throws): make
// `ordinal` the calling thread's current device, and read it back.
void device_make_current(int ordinal);
int device_current();

}  // namespace llmtrain::kernels
