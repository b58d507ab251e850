// Buffer: owning memory of one dtype, shape and device, from that device's allocator
// (kernels/allocator.h). Flat parameter/gradient buffers, optimizer moments and activation
// arenas are Buffers; ops only ever see Tensor views of them.
//
// Every Buffer says what its memory is for (MemoryKind); the bytes each kind holds now and at its
// peak are counted per device (memory_use), which is what a run reports as measured memory beside
// the plan the trainer computes without allocating (trainer/placement/memory.h).
//
// Rule a reader could get wrong: a Buffer's contents start zeroed, and its views die with it —
// a Tensor taken from tensor() must not outlive the Buffer (moving a Buffer keeps the memory, so
// views stay valid across a move).
#pragma once

#include <cstddef>

#include "kernels/tensor.h"

namespace llmtrain::kernels {

// What a buffer's memory is for, in the categories of the memory account.
enum class MemoryKind : uint8_t { parameters, gradients, optimizer, activations, communication, other };
inline constexpr int kMemoryKinds = 6;
const char* to_string(MemoryKind kind);

struct MemoryUse {
  int64_t current = 0;  // bytes held now
  int64_t peak = 0;     // the most held at once since the process started (or the last reset)
};
// Bytes of Buffers of `kind` on `device` (as requested, before the allocator's rounding). Thread-safe.
MemoryUse memory_use(Device device, MemoryKind kind);
// All kinds together: the peak of their sum, not the sum of their peaks.
MemoryUse memory_use(Device device);
// Starts the peaks over from what is held now. Only tests call it (they measure one phase's peak:
// tests/planner/test_plan_memory.cpp against the memory account); it belongs with the counters.
void memory_reset_peaks();

class Buffer {
 public:
  Buffer() = default;
  Buffer(DType dtype, Shape shape, Device device = Device::cpu, MemoryKind kind = MemoryKind::other);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  Tensor tensor() const { return Tensor(data_, dtype_, shape_, device_); }
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  int64_t numel() const { return shape_.numel(); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  MemoryKind kind() const { return kind_; }

  template <typename T>
  T* ptr() const {
    return tensor().ptr<T>();
  }

 private:
  void release() noexcept;

  void* data_ = nullptr;
  size_t bytes_ = 0;
  DType dtype_ = DType::fp32;
  Device device_ = Device::cpu;
  MemoryKind kind_ = MemoryKind::other;
  Shape shape_;
};

}  // namespace llmtrain::kernels
