#include "kernels/buffer.h"

#include <atomic>
#include <utility>

#include "kernels/allocator.h"
#include "kernels/ops.h"

namespace llmtrain::kernels {

namespace {

constexpr int kDevices = 2;
struct Counter {
  std::atomic<int64_t> current{0}, peak{0};
};
Counter g_use[kDevices][kMemoryKinds];
Counter g_total[kDevices];

void raise_peak(Counter& c, int64_t now) {
  int64_t p = c.peak.load(std::memory_order_relaxed);
  while (now > p && !c.peak.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
  }
}

void account(Device device, MemoryKind kind, int64_t delta) {
  Counter& k = g_use[int(device)][int(kind)];
  Counter& t = g_total[int(device)];
  raise_peak(k, k.current.fetch_add(delta, std::memory_order_relaxed) + delta);
  raise_peak(t, t.current.fetch_add(delta, std::memory_order_relaxed) + delta);
}

MemoryUse read(const Counter& c) { return {c.current.load(), c.peak.load()}; }

}  // namespace

const char* to_string(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::parameters:
      return "parameters";
    case MemoryKind::gradients:
      return "gradients";
    case MemoryKind::optimizer:
      return "optimizer state";
    case MemoryKind::activations:
      return "activations";
    case MemoryKind::communication:
      return "communication buffers";
    case MemoryKind::other:
      return "other";
  }
  return "?";
}

MemoryUse memory_use(Device device, MemoryKind kind) { return read(g_use[int(device)][int(kind)]); }
MemoryUse memory_use(Device device) { return read(g_total[int(device)]); }

void memory_reset_peaks() {
  for (auto& per_device : g_use)
    for (Counter& c : per_device) c.peak.store(c.current.load());
  for (Counter& c : g_total) c.peak.store(c.current.load());
}

Buffer::Buffer(DType dtype, Shape shape, Device device, MemoryKind kind)
    : dtype_(dtype), device_(device), kind_(kind), shape_(shape) {
  bytes_ = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  data_ = allocator_for(device).allocate(bytes_);
  account(device_, kind_, int64_t(bytes_));
  fill_zero(tensor());
}

Buffer::~Buffer() { release(); }

Buffer::Buffer(Buffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      dtype_(o.dtype_),
      device_(o.device_),
      kind_(o.kind_),
      shape_(o.shape_) {}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    dtype_ = o.dtype_;
    device_ = o.device_;
    kind_ = o.kind_;
    shape_ = o.shape_;
  }
  return *this;
}

void Buffer::release() noexcept {
  if (data_) {
    allocator_for(device_).deallocate(data_, bytes_);
    account(device_, kind_, -int64_t(bytes_));
  }
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace llmtrain::kernels
