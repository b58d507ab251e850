// Host memory: 64-byte aligned (kAlignment), rounded up to whole alignment units as
// std::aligned_alloc requires.
#include "kernels/allocator.h"

#include <cstdlib>

#include "common/error.h"
#include "common/strings.h"

namespace llmtrain::kernels::cpu {

namespace {

class HostAllocator final : public Allocator {
 public:
  Device device() const override { return Device::cpu; }

  void* allocate(size_t bytes) override {
    size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    if (rounded == 0) rounded = kAlignment;
    void* p = std::aligned_alloc(kAlignment, rounded);
    if (!p)
      throw environment_error(fmt::format("out of host memory allocating {}", format_bytes(double(bytes))),
                              "lower train.micro_batch, or use a machine with more memory");
    return p;
  }

  void deallocate(void* p, size_t) noexcept override { std::free(p); }
};

}  // namespace

Allocator& host_allocator() {
  static HostAllocator allocator;
  return allocator;
}

}  // namespace llmtrain::kernels::cpu
