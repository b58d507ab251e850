// Points in a device's stream of work, for timing that work without waiting for it (the training
// step's timer, trainer/loop/step_timer.h; the op profile, kernels/op_profile.h): record(i) marks the
// point after the work queued so far (record(i, stream): on a side stream of ours), and
// seconds(from, to) is the time between two marks.
//
// The rule a reader could get wrong: on cuda a mark is an event queued behind the launched kernels
// (CUDA's events; the simulator's, whose work is done when its call returns), so recording waits for
// nothing, but seconds() waits for the later mark: read the marks after the work that must not
// wait (a step's timer reads them once its scalars are on the host). On the CPU, whose ops are done
// when they return, a mark is the host clock. The marks are created once: recording allocates
// nothing.
#pragma once

#include <memory>
#include <vector>

#include "kernels/tensor.h"

namespace llmtrain::kernels {

namespace cuda {
class Stream;
}

class DeviceMarks {
 public:
  DeviceMarks(Device device, int count);
  ~DeviceMarks();
  DeviceMarks(const DeviceMarks&) = delete;
  DeviceMarks& operator=(const DeviceMarks&) = delete;

  int count() const { return count_; }
  void record(int i);
  void record(int i, const cuda::Stream& stream);  // cuda only
  // Marks `from` and `to` both recorded, `to` after `from`.
  double seconds(int from, int to) const;

 private:
  struct Events;  // cuda's (kernels/cuda/stream.h)

  Device device_;
  int count_;
  std::vector<double> host_s_;  // the CPU's marks
  std::unique_ptr<Events> events_;
};

}  // namespace llmtrain::kernels
