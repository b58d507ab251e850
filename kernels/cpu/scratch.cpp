#include "kernels/cpu/scratch.h"

#include <cstdlib>

#include "common/error.h"
#include "kernels/allocator.h"

namespace llmtrain::kernels::cpu {

namespace {
struct Slot {
  float* data = nullptr;
  size_t floats = 0;
  ~Slot() { std::free(data); }
};
thread_local Slot slots[kScratchSlots];
}  // namespace

float* thread_scratch(int slot, size_t floats) {
  LT_CHECK(slot >= 0 && slot < kScratchSlots, "scratch slot {}", slot);
  Slot& s = slots[slot];
  if (s.floats < floats) {
    std::free(s.data);
    size_t bytes = (floats * sizeof(float) + kAlignment - 1) / kAlignment * kAlignment;
    s.data = static_cast<float*>(std::aligned_alloc(kAlignment, bytes));
    LT_CHECK(s.data, "out of memory for {} bytes of scratch", bytes);
    s.floats = floats;
  }
  return s.data;
}

}  // namespace llmtrain::kernels::cpu
