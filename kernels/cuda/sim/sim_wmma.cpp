// The WMMA model's checks that need no template (kernels/cuda/sim/sim_wmma.h has the model): one
// lane's mptr and ldm against CUDA's rules, and the warp's agreement on them.
//
// The rule a reader could get wrong: these are the CUDA C++ Programming Guide's rules and no more
// (mptr 256-bit aligned, ldm a multiple of 16 bytes); ldm below 16 is allowed, as in CUDA.
#include "kernels/cuda/sim/sim_wmma.h"

#include <cstdio>
#include <string>

namespace llmtrain::cuda_sim::wmma_model {
namespace {

std::string pointer_text(const void* p) {
  char text[32];
  std::snprintf(text, sizeof(text), "%p", p);
  return text;
}

}  // namespace

void check_memory(const char* what, const std::source_location& where, const void* ptr, unsigned ldm,
                  size_t element_bytes) {
  if (reinterpret_cast<uintptr_t>(ptr) % 32 != 0)
    warp_call_failed(what, where,
                     "mptr " + pointer_text(ptr) +
                         " is not 256-bit (32-byte) aligned, as CUDA requires (dynamic shared memory is only "
                         "16-byte aligned: round the pointer up)");
  if (ldm * element_bytes % 16 != 0)
    warp_call_failed(what, where,
                     "ldm " + std::to_string(ldm) + " is not a multiple of " + std::to_string(16 / element_bytes) +
                         " (16 bytes of " + std::to_string(element_bytes) + "-byte elements), as CUDA requires");
}

std::string same_memory_arguments(void* const* lanes) {
  const auto* first = static_cast<const MemoryArgs*>(lanes[0]);
  for (int l = 1; l < 32; ++l) {
    const auto* a = static_cast<const MemoryArgs*>(lanes[l]);
    const std::string lane = "lane " + std::to_string(l);
    if (a->ptr != first->ptr)
      return lane + " passes mptr " + pointer_text(a->ptr) + ", lane 0 " + pointer_text(first->ptr) +
             ": every lane of the warp must pass the same mptr";
    if (a->ldm != first->ldm)
      return lane + " passes ldm " + std::to_string(a->ldm) + ", lane 0 " + std::to_string(first->ldm) +
             ": every lane of the warp must pass the same ldm";
    if (a->layout != first->layout)
      return lane + " passes layout " + std::to_string(a->layout) + ", lane 0 " + std::to_string(first->layout) +
             ": every lane of the warp must pass the same layout";
  }
  return {};
}

}  // namespace llmtrain::cuda_sim::wmma_model
