// What the simulator's own files share (not for kernels): errors, the device-memory access window.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace llmtrain::cuda_sim {

// Dynamic shared memory a launch may ask for: an H100's opt-in maximum per block.
inline constexpr size_t kMaxDynamicSharedBytes = 227 * 1024;
// What a kernel may ask for without the opt-in (cudaFuncAttributeMaxDynamicSharedMemorySize).
inline constexpr size_t kDefaultDynamicSharedBytes = 48 * 1024;
// The dynamic shared memory `func` (a kernel, or null) may ask for on the calling thread's current
// device: what cudaFuncSetAttribute set there for it, else kDefaultDynamicSharedBytes.
size_t dynamic_shared_limit(const void* func);

// Misuse the hardware would turn into a fault or a hang: print and abort.
[[noreturn]] void fatal(const std::string& message);

// The error cudaGetLastError returns next (a launch's configuration error).
void set_last_error(cudaError_t e);
// Sets the error cudaGetLastError returns next and returns it: a failed call's `return fail(e)`.
cudaError_t fail(cudaError_t e);
// fail(e), and cudaGetErrorString(e) on this thread says `why` after CUDA's text until the next
// failure: the simulator's reason for refusing a call (a stream it does not accept, say).
cudaError_t fail_because(cudaError_t e, std::string why);
// The reason given by the last fail_because on this thread for `e`, or "".
const char* failure_reason(cudaError_t e);

// What tests count (kernels/cuda/sim/sim_counters.h): a host wait for the device, a copy to the host,
// a kernel launch.
void count_synchronization();
void count_read();
void count_pageable_upload();
void count_launch();
void count_event();

// Why `stream` may not take work ("" when it may): the legacy default stream (unless a test allows
// it, sim_rules.h), or a stream the runtime did not create or has destroyed.
std::string stream_problem(cudaStream_t stream);

// Queues `work` (named `what` in a refusal) on `stream`, to run when the host next needs that
// stream's work, interleaved with other streams as CUDA allows (kernels/cuda/sim/sim_streams.cpp);
// on the legacy default stream, where allowed, it runs now, after every blocking stream's work.
// Device memory is accessible while it runs. A stream it refuses fails with
// cudaErrorInvalidResourceHandle and queues nothing.
cudaError_t enqueue(cudaStream_t stream, std::function<void()> work, const char* what);

// Stream work that completes only together with work on other streams, which other host threads
// queue: one rank's part of an NCCL operation (sim_nccl.cpp). progress() is called, with the
// device's lock held, whenever the item is at the front of its stream (everything queued before it
// there has run); it does what can be done now and returns true once this part is complete (the
// item then leaves its stream). It must be cheap and may be called many times.
class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  virtual bool progress() = 0;
  // What it is waiting for, for the simulator's message when the device hangs.
  virtual std::string describe() const = 0;
};
// Queues `rendezvous` on `stream`; returns why the stream was refused, or "".
std::string enqueue_rendezvous(cudaStream_t stream, std::shared_ptr<Rendezvous> rendezvous);
// How long the device waits for work another host thread must queue before the simulator ends the
// process as hung (LLMTRAIN_SIM_HANG_SECONDS, default 300).
double hang_seconds();
// Runs whatever queued work can run now without waiting for other host threads (a library's poll).
void advance();
// Wakes host threads waiting for the device after a library changed a rendezvous's state outside
// stream work (an abort releases its parts).
void notify_device_state();
// Runs the queued work of every stream of the calling thread's current device (what
// cudaDeviceSynchronize and cudaFree wait for).
void drain_device();
// The calling thread's current device (cudaSetDevice; 0 until set).
int current_device();

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
