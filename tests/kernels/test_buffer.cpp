// Owning buffers and the per-device allocators (kernels/buffer.h, kernels/allocator.h).
#include <gtest/gtest.h>

#include <cstdint>

#include "common/error.h"
#include "kernels/allocator.h"
#include "kernels/backend_info.h"
#include "kernels/buffer.h"
#include "kernels/ops.h"

namespace llmtrain::kernels {

TEST(Buffer, HostMemoryIsAlignedAndZeroed) {
  for (int64_t n : {int64_t(1), int64_t(3), int64_t(1000), int64_t(1) << 21}) {
    Buffer b(DType::fp32, {n});
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % kAlignment, 0u);
    EXPECT_EQ(b.bytes(), size_t(n) * 4);
    const float* p = b.ptr<float>();
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(p[i], 0.0f);
  }
}

TEST(Buffer, MoveKeepsTheMemory) {
  Buffer a(DType::int32, {4, 5});
  a.ptr<int32_t>()[7] = 42;
  void* data = a.data();
  Buffer b = std::move(a);
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(b.ptr<int32_t>()[7], 42);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(b.tensor().shape, (Shape{4, 5}));
  Buffer c(DType::bf16, {2});
  c = std::move(b);
  EXPECT_EQ(c.data(), data);
  EXPECT_EQ(c.dtype(), DType::int32);
}

// Device memory: an error naming what is missing in a build without the CUDA backend or on a
// machine without a device; zeroed memory that copies to and from the host where there is one (a
// GPU, or the simulator of the LLMTRAIN_CUDA=SIM build).
TEST(Buffer, DeviceMemoryWhereThereIsADevice) {
  const CudaInfo cuda = cuda_info();
  if (!cuda.built || cuda.devices.empty()) {
    try {
      Buffer b(DType::fp32, {16}, Device::cuda);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(cuda.built ? "cudaMalloc" : "not supported yet"), std::string::npos) << what;
    }
    return;
  }
  Buffer d(DType::int32, {1000}, Device::cuda, MemoryKind::activations);
  EXPECT_EQ(memory_use(Device::cuda, MemoryKind::activations).current, 4000);
  Buffer h(DType::int32, {1000});
  for (int i = 0; i < 1000; ++i) h.ptr<int32_t>()[i] = i;
  copy(h.tensor(), d.tensor());  // starts zeroed
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(h.ptr<int32_t>()[i], 0);
  for (int i = 0; i < 1000; ++i) h.ptr<int32_t>()[i] = 3 * i;
  copy(d.tensor(), h.tensor());
  Buffer d2(DType::int32, {1000}, Device::cuda);
  copy(d2.tensor(), d.tensor());
  Buffer back(DType::int32, {1000});
  copy(back.tensor(), d2.tensor());
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(back.ptr<int32_t>()[i], 3 * i);
}

// The memory account's measured side: bytes per kind now and at the peak, moves and releases
// included (this test binary allocates nothing else of these kinds while it runs).
TEST(Buffer, MemoryIsCountedByKind) {
  const MemoryUse act0 = memory_use(Device::cpu, MemoryKind::activations);
  const MemoryUse opt0 = memory_use(Device::cpu, MemoryKind::optimizer);
  memory_reset_peaks();
  {
    Buffer a(DType::fp32, {1000}, Device::cpu, MemoryKind::activations);
    Buffer b(DType::bf16, {10}, Device::cpu, MemoryKind::optimizer);
    EXPECT_EQ(memory_use(Device::cpu, MemoryKind::activations).current, act0.current + 4000);
    EXPECT_EQ(memory_use(Device::cpu, MemoryKind::optimizer).current, opt0.current + 20);
    Buffer moved = std::move(a);  // a move changes no count
    EXPECT_EQ(moved.kind(), MemoryKind::activations);
    EXPECT_EQ(memory_use(Device::cpu, MemoryKind::activations).current, act0.current + 4000);
    moved = Buffer(DType::fp32, {10}, Device::cpu, MemoryKind::activations);  // releases the 4000
    EXPECT_EQ(memory_use(Device::cpu, MemoryKind::activations).current, act0.current + 40);
  }
  EXPECT_EQ(memory_use(Device::cpu, MemoryKind::activations).current, act0.current);
  EXPECT_EQ(memory_use(Device::cpu, MemoryKind::activations).peak, act0.current + 4040);
  EXPECT_EQ(memory_use(Device::cpu, MemoryKind::optimizer).peak, opt0.current + 20);
  EXPECT_GE(memory_use(Device::cpu).peak, memory_use(Device::cpu).current + 4060);
  memory_reset_peaks();
  EXPECT_EQ(memory_use(Device::cpu, MemoryKind::activations).peak, act0.current);
}

}  // namespace llmtrain::kernels
