// Per-thread scratch memory for the CPU ops (softmax blocks of attention, partial sums of
// reductions). Each slot of each thread grows to its high-water mark during the first step and is
// reused afterwards, so a training step allocates nothing once warm.
//
// Rule a reader could get wrong: the pointer is valid until the same thread asks for the same
// slot again; two live uses within one op must take different slots.
#pragma once

#include <cstddef>

namespace llmtrain::kernels::cpu {

inline constexpr int kScratchSlots = 5;
// The slot kernels/dispatch.cpp widens 16-bit operands into (kernels/ops.h); no op uses it.
inline constexpr int kWidenSlot = 4;

// At least `floats` floats, 64-byte aligned, owned by the calling thread.
float* thread_scratch(int slot, size_t floats);

}  // namespace llmtrain::kernels::cpu
