// Micro-batches on their way to the device. The reader (trainer/data/micro_batches.h) fills
// pageable host vectors; a copy from pageable memory to the device makes CUDA wait for the stream's
// earlier work before it stages the source, which stalls the host once per micro-batch (the
// simulator counts these: cuda_sim::HostWaits::pageable_uploads). On a cuda model each micro-batch
// is copied into a slot of pinned host memory first, from which the model's copies to the device
// are asynchronous; on a cpu model it passes through.
//
// Rules a reader could get wrong:
//  - A slot must stay untouched until the device has copied out of it: used() records an event on
//    the compute stream behind the model's copies, and a slot is refilled only once its event is
//    done (a bounded wait). With a slot per read of a step it never waits (the step's scalar read at
//    its end has made every copy done before the next step reuses a slot); the step caps the slots
//    at kMaxUploadSlots, beyond which a host that runs that many reads ahead of the device waits for
//    the oldest copy, which throttles the host and never the device.
//  - stage() and used() alternate: one staged micro-batch at a time, used() after the model queued
//    its copies of it.
#pragma once

#include <memory>
#include <vector>

#include "kernels/device_stream.h"
#include "trainer/model/model.h"

namespace llmtrain::trainer {

// The most slots a training step keeps (pinned memory is a scarce, slow-to-allocate resource; a
// step of many micro-batches reuses them).
inline constexpr int kMaxUploadSlots = 16;

class MicroBatchUpload {
 public:
  // `slots`: how many micro-batches may be in flight (reads per step); `timeout_s` bounds a wait for
  // a slot (parallel.timeout).
  MicroBatchUpload(kernels::Device device, int slots, double timeout_s);
  ~MicroBatchUpload();

  // `mb` (host tensors) as the model should read it: `mb` itself on a cpu model, else its tokens
  // and targets in the next pinned slot.
  MicroBatch stage(const MicroBatch& mb);
  // The model has queued its copies of the micro-batch stage() returned last.
  void used();

 private:
  struct Slot;
  kernels::Device device_;
  double timeout_s_;
  std::vector<std::unique_ptr<Slot>> slots_;
  size_t next_ = 0;
  Slot* staged_ = nullptr;
};

}  // namespace llmtrain::trainer
