// DeviceMarks (kernels/device_marks.h): the host clock on the CPU, events on cuda.
#include "kernels/device_marks.h"

#include "common/clock.h"
#include "common/error.h"

#if LLMTRAIN_CUDA_BACKEND
#include "kernels/cuda/stream.h"
#endif

namespace llmtrain::kernels {

#if LLMTRAIN_CUDA_BACKEND
struct DeviceMarks::Events {
  std::vector<std::unique_ptr<cuda::Event>> events;
};
#else
struct DeviceMarks::Events {};
#endif

DeviceMarks::DeviceMarks(Device device, int count) : device_(device), count_(count) {
  LT_CHECK(count >= 2, "{} device marks: timing needs two", count);
  if (device == Device::cpu) {
    host_s_.assign(size_t(count), 0.0);
    return;
  }
#if LLMTRAIN_CUDA_BACKEND
  events_ = std::make_unique<Events>();
  for (int i = 0; i < count; ++i) events_->events.push_back(std::make_unique<cuda::Event>());
#else
  throw Error("not supported yet: timing a CUDA device in this build (it has no CUDA backend)",
              "use train.device: cpu, or build with the CUDA backend");
#endif
}

DeviceMarks::~DeviceMarks() = default;

void DeviceMarks::record(int i) {
  LT_CHECK(i >= 0 && i < count_, "device mark {} of {}", i, count_);
  if (device_ == Device::cpu) {
    host_s_[size_t(i)] = now_s();
    return;
  }
#if LLMTRAIN_CUDA_BACKEND
  events_->events[size_t(i)]->record();
#endif
}

void DeviceMarks::record(int i, const cuda::Stream& stream) {
  LT_CHECK(i >= 0 && i < count_ && device_ == Device::cuda, "device mark {} of {} on a stream", i, count_);
#if LLMTRAIN_CUDA_BACKEND
  events_->events[size_t(i)]->record(stream);
#else
  (void)stream;
#endif
}

double DeviceMarks::seconds(int from, int to) const {
  LT_CHECK(from >= 0 && from < count_ && to >= 0 && to < count_, "device marks {} and {} of {}", from, to, count_);
  if (device_ == Device::cpu) return host_s_[size_t(to)] - host_s_[size_t(from)];
#if LLMTRAIN_CUDA_BACKEND
  return double(events_->events[size_t(to)]->elapsed_ms_since(*events_->events[size_t(from)])) / 1e3;
#else
  return 0;
#endif
}

}  // namespace llmtrain::kernels
