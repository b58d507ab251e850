// What the simulator's own files share (not for kernels): errors, the device-memory access window.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <string>

namespace llmtrain::cuda_sim {

// Dynamic shared memory a launch may ask for: an H100's opt-in maximum per block.
inline constexpr size_t kMaxDynamicSharedBytes = 227 * 1024;

// Misuse the hardware would turn into a fault or a hang: print and abort.
[[noreturn]] void fatal(const std::string& message);

// The error cudaGetLastError returns next (a launch's configuration error).
void set_last_error(cudaError_t e);
// Sets the error cudaGetLastError returns next and returns it: a failed call's `return fail(e)`.
cudaError_t fail(cudaError_t e);

// What tests count (kernels/cuda/sim/sim_counters.h): a host wait for the device, a copy to the host,
// a kernel launch.
void count_synchronization();
void count_read();
void count_pageable_upload();
void count_launch();

// Queues `work` on `stream`, to run when the host next needs that stream's work, interleaved with
// other streams as CUDA allows (kernels/cuda/sim/sim_streams.cpp); on the legacy default stream
// (null) it runs now, after every blocking stream's work. Device memory is accessible while it runs.
void enqueue(cudaStream_t stream, std::function<void()> work);
// Runs every stream's queued work (what cudaDeviceSynchronize and cudaFree wait for).
void drain_all();

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
