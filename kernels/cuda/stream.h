// Streams and events of the CUDA backend, owned (RAII) and checked. A Stream is non-blocking (not
// ordered with the legacy default stream); the ops run on the compute stream (compute_stream(),
// kernels/cuda/storage.h). In the simulator stream work is deferred until the host needs it, so an
// event's time is when its record ran there.
//
// The rule a reader could get wrong: an Event's elapsed time needs both events recorded and the
// later one synchronized; elapsed_ms checks both instead of returning CUDA's error as a number.
#pragma once

#include <cuda_runtime_api.h>

namespace llmtrain::kernels::cuda {

class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  void synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  // `timing`: whether elapsed_ms_since may be asked of it; an event only for ordering and queries
  // (communication's) is cheaper without (cudaEventDisableTiming).
  explicit Event(bool timing = true);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(const Stream& stream);
  void record();  // on the compute stream, which the ops launch on
  void synchronize() const;
  // Milliseconds from `start` to this event (both recorded; this one is waited for).
  float elapsed_ms_since(const Event& start) const;
  // Makes `stream` wait for this event before its later work.
  void wait_on(const Stream& stream) const;
  // Makes the compute stream wait for this event before its later work.
  void make_compute_wait() const;
  // Whether the work before the record has run (cudaEventQuery; never blocks).
  bool done() const;

 private:
  cudaEvent_t event_ = nullptr;
  bool recorded_ = false;
};

}  // namespace llmtrain::kernels::cuda
