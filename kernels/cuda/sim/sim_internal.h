// What the simulator's own files share (not for kernels): errors, the device-memory access window.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

namespace llmtrain::cuda_sim {

// Dynamic shared memory a launch may ask for: an H100's opt-in maximum per block.
inline constexpr size_t kMaxDynamicSharedBytes = 227 * 1024;

// Misuse the hardware would turn into a fault or a hang: print and abort.
[[noreturn]] void fatal(const std::string& message);

// The error cudaGetLastError returns next (a launch's configuration error).
void set_last_error(cudaError_t e);

// While one exists (on any OS thread), every device allocation is readable and writable: a kernel
// or a copy is running. Outside, device memory has no access at all.
class DeviceAccess {
 public:
  DeviceAccess();
  ~DeviceAccess();
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;
};

// Whether [p, p + bytes) lies inside one live device allocation.
bool is_device_range(const void* p, size_t bytes);

}  // namespace llmtrain::cuda_sim
