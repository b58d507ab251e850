// How many devices the simulator shows: LLMTRAIN_SIM_DEVICES=N (default 1), so that N local ranks
// under mpirun each hold a simulated device of their own (kernels/device_select.h) without
// launch.share_devices. Each process's simulated memory is its own anyway; the ordinals only
// exist for cudaGetDeviceCount, cudaSetDevice and cudaGetDevice (and `llmtrain env`).
//
// The rule a reader could get wrong: a bad value is not quietly 1. cudaGetDeviceCount then fails
// (cudaErrorInvalidValue) and cuda_info() reports the message below as the reason no device is
// usable, which `llmtrain env`, the pre-flight checks and device_select print.
#pragma once

#include <string>

namespace llmtrain::cuda_sim {

inline constexpr const char* kSimDevicesEnv = "LLMTRAIN_SIM_DEVICES";
inline constexpr int kMaxSimDevices = 64;

struct SimDevices {
  int count = 1;
  std::string error;  // non-empty: the variable's value was malformed (count is 0 then)
};

// The pure parse: null (unset) → 1; "1".."64" → that; anything else → error naming the variable,
// the value found and what is expected.
SimDevices sim_devices_parse(const char* text);

// This process's, read from the environment on every call (tests change it).
SimDevices sim_devices();

}  // namespace llmtrain::cuda_sim
