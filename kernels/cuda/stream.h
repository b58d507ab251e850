// Streams and events of the CUDA backend, owned (RAII) and checked. On a GPU they are CUDA's; in
// the simulator every stream is in order with the host (work is done when its call returns), so an
// event's time is when it was recorded.
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
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(const Stream& stream);
  void record();  // on the default stream, which the ops launch on
  void synchronize() const;
  // Milliseconds from `start` to this event (both recorded; this one is waited for).
  float elapsed_ms_since(const Event& start) const;
  // Makes `stream` wait for this event before its later work.
  void wait_on(const Stream& stream) const;

 private:
  cudaEvent_t event_ = nullptr;
  bool recorded_ = false;
};

}  // namespace llmtrain::kernels::cuda
