// Tensor: a non-owning view of memory (data pointer, dtype, shape, device). Every op, every
// communicator call and every checkpoint slice takes views; memory is owned elsewhere (flat
// parameter/gradient buffers, activation arenas, the allocator's buffers).
//
// Rule a reader could get wrong: a view never owns or frees its data, and it is always contiguous
// (row-major, innermost dimension last). Slicing is only along the first dimension, which keeps
// that true. This header uses nothing of fmt (the CUDA entry points, compiled by nvcc, include it).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <type_traits>

namespace llmtrain::kernels {

enum class DType : uint8_t { fp32, bf16, fp16, int32, uint16, int64, uint8 };
enum class Device : uint8_t { cpu, cuda };

inline constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::fp32:
    case DType::int32:
      return 4;
    case DType::bf16:
    case DType::fp16:
    case DType::uint16:
      return 2;
    case DType::int64:
      return 8;
    case DType::uint8:
      return 1;
  }
  return 0;
}

// Names as they appear in files and messages ("F32", "BF16", ... are safetensors' names and
// live with the safetensors code).
const char* to_string(DType t);
const char* to_string(Device d);

// Up to kMaxDims dimensions, stored inline so that views cost no allocation.
class Shape {
 public:
  static constexpr int kMaxDims = 6;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[i]; }
  int64_t& operator[](int i) { return dims_[i]; }
  int64_t numel() const;
  bool operator==(const Shape& o) const;
  std::string str() const;  // "[4, 128]"

  const int64_t* begin() const { return dims_.data(); }
  const int64_t* end() const { return dims_.data() + rank_; }

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int rank_ = 0;
};

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::fp32;
  Device device = Device::cpu;
  Shape shape;

  Tensor() = default;
  Tensor(void* data, DType dtype, Shape shape, Device device = Device::cpu)
      : data(data), dtype(dtype), device(device), shape(shape) {}

  // An absent optional argument of an op is a default-constructed Tensor (no data).
  bool defined() const { return data != nullptr; }
  int64_t numel() const { return shape.numel(); }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool empty() const { return numel() == 0; }

  // Typed access to host data; checks the dtype.
  template <typename T>
  T* ptr() const;

  // Rows [begin, end) of the first dimension.
  Tensor slice(int64_t begin, int64_t end) const;
  // The same memory seen with another shape of the same element count.
  Tensor view(Shape new_shape) const;
  // A 1-D view of `count` elements starting at element `offset`.
  Tensor flat(int64_t offset, int64_t count) const;
};

// Views of typed host memory.
Tensor host_tensor(float* data, Shape shape);
Tensor host_tensor(const float* data, Shape shape);  // callers promise not to write through it
Tensor host_tensor(int32_t* data, Shape shape);
Tensor host_tensor(const int32_t* data, Shape shape);  // callers promise not to write through it

// The dtype of a host element type: DTypeOf<float>::value is DType::fp32.
template <typename T>
struct DTypeOf {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, int32_t> || std::is_same_v<T, uint16_t> ||
                    std::is_same_v<T, int64_t> || std::is_same_v<T, uint8_t>,
                "no DType for this element type");
  static constexpr DType value = std::is_same_v<T, float>      ? DType::fp32
                                 : std::is_same_v<T, int32_t>  ? DType::int32
                                 : std::is_same_v<T, uint16_t> ? DType::uint16
                                 : std::is_same_v<T, int64_t>  ? DType::int64
                                                               : DType::uint8;
};

// A broken invariant: a tensor read as another dtype than its own (aborts, naming both).
[[noreturn]] void dtype_mismatch(DType have, DType want);

template <typename T>
T* Tensor::ptr() const {
  if (dtype != DTypeOf<T>::value) [[unlikely]]
    dtype_mismatch(dtype, DTypeOf<T>::value);
  return static_cast<T*>(data);
}

}  // namespace llmtrain::kernels
