// Memory ops on host tensors: zero fill, copy and dtype conversion (the scalar rules live in
// kernels/dtype_convert.h).
#include <algorithm>
#include <cstring>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/dtype_convert.h"

namespace llmtrain::kernels::cpu {

void fill_zero(Tensor x) {
  const size_t bytes = x.bytes();
  char* p = static_cast<char*>(x.data);
  if (bytes < (size_t(1) << 20)) {
    std::memset(p, 0, bytes);
    return;
  }
  // Large buffers (flat gradients) are zeroed by all threads: one thread cannot saturate memory.
  const size_t chunk = size_t(1) << 18;
#pragma omp parallel for schedule(static)
  for (size_t off = 0; off < bytes; off += chunk) std::memset(p + off, 0, std::min(chunk, bytes - off));
}

void copy(Tensor out, Tensor in) {
  if (out.data != in.data && in.bytes() > 0) std::memmove(out.data, in.data, in.bytes());
}

void convert(Tensor out, Tensor in) {
  const int64_t n = in.numel();
  if (out.dtype == in.dtype) {
    if (out.data != in.data) std::memmove(out.data, in.data, in.bytes());
    return;
  }
  // Through fp32: every conversion among fp32, bf16 and fp16 is exact into fp32 and rounds once
  // out of it.
  auto load = [&](int64_t i) -> float {
    switch (in.dtype) {
      case DType::bf16:
        return bf16_to_fp32(static_cast<const uint16_t*>(in.data)[i]);
      case DType::fp16:
        return fp16_to_fp32(static_cast<const uint16_t*>(in.data)[i]);
      default:
        return static_cast<const float*>(in.data)[i];
    }
  };
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    float f = load(i);
    switch (out.dtype) {
      case DType::bf16:
        static_cast<uint16_t*>(out.data)[i] = fp32_to_bf16(f);
        break;
      case DType::fp16:
        static_cast<uint16_t*>(out.data)[i] = fp32_to_fp16(f);
        break;
      default:
        static_cast<float*>(out.data)[i] = f;
        break;
    }
  }
}

}  // namespace llmtrain::kernels::cpu
