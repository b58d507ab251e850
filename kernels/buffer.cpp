#include "kernels/buffer.h"

#include <utility>

#include "kernels/allocator.h"
#include "kernels/ops.h"

namespace llmtrain::kernels {

Buffer::Buffer(DType dtype, Shape shape, Device device) : dtype_(dtype), device_(device), shape_(shape) {
  bytes_ = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  data_ = allocator_for(device).allocate(bytes_);
  fill_zero(tensor());
}

Buffer::~Buffer() { release(); }

Buffer::Buffer(Buffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      dtype_(o.dtype_),
      device_(o.device_),
      shape_(o.shape_) {}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    dtype_ = o.dtype_;
    device_ = o.device_;
    shape_ = o.shape_;
  }
  return *this;
}

void Buffer::release() noexcept {
  if (data_) allocator_for(device_).deallocate(data_, bytes_);
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace llmtrain::kernels
