// Streams and events (kernels/cuda/stream.h): every call checked.
#include "kernels/cuda/stream.h"

#include <cstdio>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/storage.h"

namespace llmtrain::kernels::cuda {

Stream::Stream() { LT_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }

Stream::~Stream() {
  if (stream_ != nullptr && cudaStreamDestroy(stream_) != cudaSuccess)
    std::fprintf(stderr, "warning: cudaStreamDestroy failed\n");
}

void Stream::synchronize() const { LT_CUDA(cudaStreamSynchronize(stream_)); }

Event::Event(bool timing) {
  LT_CUDA(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
}

Event::~Event() {
  if (event_ != nullptr && cudaEventDestroy(event_) != cudaSuccess)
    std::fprintf(stderr, "warning: cudaEventDestroy failed\n");
}

void Event::record(const Stream& stream) {
  LT_CUDA(cudaEventRecord(event_, stream.get()));
  recorded_ = true;
}

void Event::record() {
  LT_CUDA(cudaEventRecord(event_, compute_stream()));
  recorded_ = true;
}

void Event::synchronize() const {
  LT_CHECK(recorded_, "Event::synchronize on an event never recorded");
  LT_CUDA(cudaEventSynchronize(event_));
}

float Event::elapsed_ms_since(const Event& start) const {
  LT_CHECK(recorded_ && start.recorded_, "Event::elapsed_ms_since needs both events recorded");
  synchronize();
  float ms = 0;
  LT_CUDA(cudaEventElapsedTime(&ms, start.event_, event_));
  return ms;
}

void Event::wait_on(const Stream& stream) const {
  LT_CHECK(recorded_, "Event::wait_on on an event never recorded");
  LT_CUDA(cudaStreamWaitEvent(stream.get(), event_, 0));
}

void Event::make_compute_wait() const {
  LT_CHECK(recorded_, "Event::make_compute_wait on an event never recorded");
  LT_CUDA(cudaStreamWaitEvent(compute_stream(), event_, 0));
}

bool Event::done() const {
  LT_CHECK(recorded_, "Event::done on an event never recorded");
  const cudaError_t e = cudaEventQuery(event_);
  if (e == cudaErrorNotReady) {
    cudaGetLastError();  // not an error: the work before the event is still running
    return false;
  }
  LT_CUDA(e);
  return true;
}

}  // namespace llmtrain::kernels::cuda
