#include "kernels/tensor.h"

#include <fmt/format.h>

#include "common/error.h"

namespace llmtrain::kernels {

const char* to_string(DType t) {
  switch (t) {
    case DType::fp32:
      return "fp32";
    case DType::bf16:
      return "bf16";
    case DType::fp16:
      return "fp16";
    case DType::int32:
      return "int32";
    case DType::uint16:
      return "uint16";
    case DType::int64:
      return "int64";
    case DType::uint8:
      return "uint8";
  }
  return "?";
}

const char* to_string(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

void dtype_mismatch(DType have, DType want) {
  LT_CHECK(false, "tensor of dtype {} accessed as {}", to_string(have), to_string(want));
  __builtin_unreachable();
}

Shape::Shape(std::initializer_list<int64_t> dims) {
  LT_CHECK(dims.size() <= kMaxDims, "shape of rank {} exceeds {}", dims.size(), kMaxDims);
  for (int64_t d : dims) {
    LT_CHECK(d >= 0, "negative dimension {}", d);
    dims_[rank_++] = d;
  }
}

Shape::Shape(std::span<const int64_t> dims) {
  LT_CHECK(dims.size() <= kMaxDims, "shape of rank {} exceeds {}", dims.size(), kMaxDims);
  for (int64_t d : dims) {
    LT_CHECK(d >= 0, "negative dimension {}", d);
    dims_[rank_++] = d;
  }
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[i];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i)
    if (dims_[i] != o.dims_[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(dims_[i]);
  return s + "]";
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  LT_CHECK(shape.rank() >= 1 && 0 <= begin && begin <= end && end <= shape[0], "slice [{}, {}) of shape {}", begin, end,
           shape.str());
  Tensor t = *this;
  int64_t row = shape[0] == 0 ? 0 : numel() / shape[0];
  t.data = static_cast<char*>(data) + static_cast<size_t>(begin * row) * dtype_size(dtype);
  t.shape[0] = end - begin;
  return t;
}

Tensor Tensor::view(Shape new_shape) const {
  LT_CHECK(new_shape.numel() == numel(), "view {} of shape {}", new_shape.str(), shape.str());
  Tensor t = *this;
  t.shape = new_shape;
  return t;
}

Tensor Tensor::flat(int64_t offset, int64_t count) const {
  LT_CHECK(offset >= 0 && count >= 0 && offset + count <= numel(), "flat [{}, +{}) of {} elements", offset, count,
           numel());
  Tensor t = *this;
  t.data = static_cast<char*>(data) + static_cast<size_t>(offset) * dtype_size(dtype);
  t.shape = Shape{count};
  return t;
}

Tensor host_tensor(float* data, Shape shape) { return Tensor(data, DType::fp32, shape); }
Tensor host_tensor(const float* data, Shape shape) { return Tensor(const_cast<float*>(data), DType::fp32, shape); }
Tensor host_tensor(int32_t* data, Shape shape) { return Tensor(data, DType::int32, shape); }
Tensor host_tensor(const int32_t* data, Shape shape) { return Tensor(const_cast<int32_t*>(data), DType::int32, shape); }

}  // namespace llmtrain::kernels
