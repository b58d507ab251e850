// Reading a float tensor as it is stored (fp32, bf16 or fp16), element by element in fp32: for the
// CPU ops that take one operand in any float dtype without widening it first (the multi-tensor
// optimizer ops, whose operand is a whole flat buffer). And the storage of the call running on this
// thread, for the ops made of two table ops whose intermediate must be rounded as the first would
// have stored it (round_as_stored).
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

// The storage dtype of the CPU op call running on this thread: the 16-bit dtype kernels/dispatch.cpp
// widened its operands from, or fp32. Dispatch sets it around each CPU call (CallStorage).
inline thread_local DType tl_call_storage = DType::fp32;

struct CallStorage {
  explicit CallStorage(DType d) : saved(tl_call_storage) { tl_call_storage = d; }
  ~CallStorage() { tl_call_storage = saved; }
  CallStorage(const CallStorage&) = delete;
  CallStorage& operator=(const CallStorage&) = delete;
  DType saved;
};

// Rounds the widened fp32 tensor t in place to the call's storage and back (nothing with fp32
// storage): what a table op would have stored for it, read back by the next.
inline void round_as_stored(Tensor t) {
  const DType d = tl_call_storage;
  if (d == DType::fp32) return;
  float* x = t.ptr<float>();
  const int64_t n = t.numel();
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i)
    x[i] = d == DType::bf16 ? bf16_to_fp32(fp32_to_bf16(x[i])) : fp16_to_fp32(fp32_to_fp16(x[i]));
}

}  // namespace llmtrain::kernels::cpu
