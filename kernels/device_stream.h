// What communication needs of a device beyond the ops: a stream of its own beside the compute
// stream, events that order the two, and pinned host memory, which copies to and from the device
// asynchronously (the staged communicator, parallel/comm/comm_staged.h). CUDA's streams and events on
// cuda; in a build without the CUDA backend constructing one is an error.
//
// The rule a reader could get wrong: work on a DeviceStream is ordered with the compute stream only
// through events (record on one, wait on the other), and the host may read pinned memory that a
// copy writes only once an event recorded behind that copy is done().
#pragma once

#include <cstddef>
#include <memory>

#include "kernels/tensor.h"

namespace llmtrain::kernels {

class DeviceStream {
 public:
  DeviceStream();
  ~DeviceStream();
  DeviceStream(const DeviceStream&) = delete;
  DeviceStream& operator=(const DeviceStream&) = delete;

  // Copies `in` to `out` (the same bytes) on this stream after its earlier work: device to device,
  // or between the device and pinned host memory (PinnedBuffer).
  void copy_async(Tensor out, Tensor in);

 private:
  friend class DeviceEvent;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class DeviceEvent {
 public:
  DeviceEvent();
  ~DeviceEvent();
  DeviceEvent(const DeviceEvent&) = delete;
  DeviceEvent& operator=(const DeviceEvent&) = delete;

  // Marks the point after the work queued so far on the compute stream, or on `stream`.
  void record_compute();
  void record(DeviceStream& stream);
  // The compute stream's (or `stream`'s) later work waits for the recorded point.
  void make_compute_wait() const;
  void make_wait(DeviceStream& stream) const;
  // Whether the work before the recorded point has run; never blocks.
  bool done() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// While it lives, the ops of the thread that made it go on a compute stream of its own instead of
// the process's (cuda; nothing on the CPU): ranks that are threads of one process (the in-process
// runner, tests of several ranks on one device) each order their work on their own stream, as ranks
// in processes do, so that one rank's wait for a collective never holds up another's kernels.
// Destroy it on the same thread, after the work queued on it is no longer needed.
class ThreadComputeStream {
 public:
  explicit ThreadComputeStream(Device device);
  ~ThreadComputeStream();
  ThreadComputeStream(const ThreadComputeStream&) = delete;
  ThreadComputeStream& operator=(const ThreadComputeStream&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Page-locked host memory (cudaMallocHost): copies between it and the device are asynchronous.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  size_t bytes() const { return bytes_; }
  // The first `shape`'s elements as a host tensor (checked to fit).
  Tensor tensor(DType dtype, Shape shape) const;

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace llmtrain::kernels
