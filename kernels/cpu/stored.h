// Reading a float tensor as it is stored (fp32, bf16 or fp16), element by element in fp32: for the
// CPU ops that take one operand in any float dtype without widening it first (the multi-tensor
// optimizer ops, whose operand is a whole flat buffer).
#pragma once

#include <cstdint>

#include "common/error.h"
#include "kernels/dtype_convert.h"
#include "kernels/tensor.h"

namespace llmtrain::kernels::cpu {

// Calls f(load) with load(i) = element i of t as fp32.
template <class F>
void with_stored(const Tensor& t, F&& f) {
  switch (t.dtype) {
    case DType::fp32: {
      const float* q = static_cast<const float*>(t.data);
      f([q](int64_t i) { return q[i]; });
      return;
    }
    case DType::bf16: {
      const uint16_t* q = static_cast<const uint16_t*>(t.data);
      f([q](int64_t i) { return bf16_to_fp32(q[i]); });
      return;
    }
    case DType::fp16: {
      const uint16_t* q = static_cast<const uint16_t*>(t.data);
      f([q](int64_t i) { return fp16_to_fp32(q[i]); });
      return;
    }
    default:
      break;
  }
  LT_CHECK(false, "a {} tensor where a float one is read", to_string(t.dtype));
}

}  // namespace llmtrain::kernels::cpu
