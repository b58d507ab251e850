// What the simulated device counts for tests: the calls that make the host wait for the device, and
// the kernel launches.
// A GPU overlaps its work with the host's only while the host does not wait, so a test can hold a
// training step to the waits it needs (tests/trainer/loop/test_step_sync_sim.cpp).
#pragma once

#include <cstdint>

namespace llmtrain::cuda_sim {

struct HostWaits {
  int64_t synchronizations = 0;  // cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize
  int64_t reads = 0;             // device-to-host copies (each waits for the work that writes its source)
  // Host-to-device copies from pageable memory: CUDA waits for the stream's earlier work before it
  // stages the source, so each stalls the host like a synchronization (pinned sources do not).
  int64_t pageable_uploads = 0;
};

// Since the process started, over every thread.
HostWaits host_waits();
// Events created (cudaEventCreate*), since the process started, over every thread: what a
// communicator that makes one per operation costs.
int64_t events_created();
// Kernel launches accepted (a bad configuration is not counted), since the process started, over
// every thread: what a step costs the host in launch overhead on a real GPU.
int64_t kernel_launches();

}  // namespace llmtrain::cuda_sim
