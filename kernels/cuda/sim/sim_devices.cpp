// LLMTRAIN_SIM_DEVICES, the simulator's device count (kernels/cuda/sim/sim_devices.h).
#include "kernels/cuda/sim/sim_devices.h"

#include <cstdlib>

namespace llmtrain::cuda_sim {

SimDevices sim_devices_parse(const char* text) {
  SimDevices d;
  if (text == nullptr) return d;
  const std::string s = text;
  int value = 0;
  bool ok = !s.empty() && s.size() <= 2;
  for (char c : s) {
    if (c < '0' || c > '9') ok = false;
    value = value * 10 + (c - '0');
  }
  if (ok && value >= 1 && value <= kMaxSimDevices) {
    d.count = value;
    return d;
  }
  d.count = 0;
  d.error = std::string(kSimDevicesEnv) + "=\"" + s + "\": expected a whole number of simulated devices from 1 to " +
            std::to_string(kMaxSimDevices);
  return d;
}

SimDevices sim_devices() { return sim_devices_parse(std::getenv(kSimDevicesEnv)); }

}  // namespace llmtrain::cuda_sim
