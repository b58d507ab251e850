// Buffer: owning memory of one dtype, shape and device, from that device's allocator
// (kernels/allocator.h). Flat parameter/gradient buffers, optimizer moments and activation
// arenas are Buffers; ops only ever see Tensor views of them.
//
// Rule a reader could get wrong: a Buffer's contents start zeroed, and its views die with it —
// a Tensor taken from tensor() must not outlive the Buffer (moving a Buffer keeps the memory, so
// views stay valid across a move).
#pragma once

#include <cstddef>

#include "kernels/tensor.h"

namespace llmtrain::kernels {

class Buffer {
 public:
  Buffer() = default;
  Buffer(DType dtype, Shape shape, Device device = Device::cpu);
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
  Shape shape_;
};

}  // namespace llmtrain::kernels
