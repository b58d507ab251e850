// fp32 <-> bf16/fp16 conversions (kernels/dtype_convert.h, the `convert` op) against independent
// references: the compiler's _Float16 (libgcc / F16C) for fp16, and exact nearest-even rounding
// computed in double for bf16. Every fp16 pattern and a stride through all 2^32 fp32 patterns.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/backend_info.h"
#include "kernels/buffer.h"
#include "kernels/dtype_convert.h"
#include "kernels/ops.h"

namespace llmtrain::kernels {

namespace {

// Nearest bf16 by comparing the two neighbouring candidates in double (ties to the even one).
uint16_t reference_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return uint16_t((x >> 16) | 0x40);
  uint32_t lo = x & 0xffff0000u, hi = lo + 0x10000u;
  auto value = [](uint32_t bits) {
    // For rounding, the pattern after the largest finite value acts as 2^128 (IEEE's rule).
    if ((bits & 0x7fffffffu) == 0x7f800000u)
      return std::copysign(std::ldexp(1.0, 128), double(std::bit_cast<float>(bits)));
    return double(std::bit_cast<float>(bits));
  };
  if ((x & 0x7fffffffu) == 0x7f800000u) return uint16_t(x >> 16);  // ±inf
  const double d = f, dl = std::abs(d - value(lo)), dh = std::abs(value(hi) - d);
  if (dl < dh) return uint16_t(lo >> 16);
  if (dh < dl) return uint16_t(hi >> 16);
  return ((lo >> 16) & 1) ? uint16_t(hi >> 16) : uint16_t(lo >> 16);
}

uint16_t reference_fp16(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

float reference_fp16_to_fp32(uint16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, 2);
  return static_cast<float>(h);
}

bool same(float a, float b) {
  return std::isnan(a) ? std::isnan(b) : std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

std::vector<float> probe_floats() {
  std::vector<float> out;
  for (uint64_t x = 0; x <= 0xffffffffull; x += 4093) out.push_back(std::bit_cast<float>(uint32_t(x)));
  // Edges: ties, overflow thresholds, subnormals, signed zeros, infinities.
  for (uint32_t x : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7f7fffffu, 0x7f7f8000u, 0x7f7f7fffu,
                     0x3f808000u, 0x3f818000u, 0x477fe000u, 0x477ff000u, 0x477fefffu, 0x33000000u, 0x33000001u,
                     0x38800000u, 0x387fffffu, 0x33800000u, 0x34000000u, 0x00000001u, 0x3fc00000u})
    out.push_back(std::bit_cast<float>(x));
  return out;
}

}  // namespace

TEST(DTypeConvert, Fp16ToFp32EveryPattern) {
  for (uint32_t b = 0; b <= 0xffff; ++b)
    ASSERT_TRUE(same(fp16_to_fp32(uint16_t(b)), reference_fp16_to_fp32(uint16_t(b)))) << std::hex << b;
}

TEST(DTypeConvert, Fp32ToFp16RoundsToNearestEven) {
  for (float f : probe_floats()) {
    uint16_t got = fp32_to_fp16(f), want = reference_fp16(f);
    if (std::isnan(f))
      ASSERT_TRUE(std::isnan(fp16_to_fp32(got))) << std::hex << std::bit_cast<uint32_t>(f);
    else
      ASSERT_EQ(got, want) << std::hex << std::bit_cast<uint32_t>(f) << " (" << f << ")";
  }
}

TEST(DTypeConvert, Bf16RoundTripAndNearestEven) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    float f = bf16_to_fp32(uint16_t(b));
    if (!std::isnan(f)) {
      ASSERT_EQ(fp32_to_bf16(f), b);  // exact values survive the round trip
    }
  }
  for (float f : probe_floats()) {
    uint16_t got = fp32_to_bf16(f), want = reference_bf16(f);
    if (std::isnan(f))
      ASSERT_TRUE(std::isnan(bf16_to_fp32(got)));
    else
      ASSERT_EQ(got, want) << std::hex << std::bit_cast<uint32_t>(f) << " (" << f << ")";
  }
}

TEST(DTypeConvert, ConvertOpOverTensors) {
  std::vector<float> x = {1.0f, -2.5f, 3.14159f, 65519.0f, 70000.0f, 1e-8f, -0.0f};
  const int64_t n = int64_t(x.size());
  std::vector<uint16_t> h(n), b(n);
  std::vector<float> back(n);
  convert(Tensor(h.data(), DType::fp16, {n}), host_tensor(x.data(), {n}));
  convert(Tensor(b.data(), DType::bf16, {n}), host_tensor(x.data(), {n}));
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(h[i], reference_fp16(x[i]));
    EXPECT_EQ(b[i], reference_bf16(x[i]));
  }
  convert(host_tensor(back.data(), {n}), Tensor(h.data(), DType::fp16, {n}));
  for (int64_t i = 0; i < n; ++i) EXPECT_TRUE(same(back[i], reference_fp16_to_fp32(h[i])));
  // fp16 -> bf16 goes through fp32 and rounds once.
  std::vector<uint16_t> hb(n);
  convert(Tensor(hb.data(), DType::bf16, {n}), Tensor(h.data(), DType::fp16, {n}));
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hb[i], reference_bf16(fp16_to_fp32(h[i])));
}

// The bulk op (vector instructions where the build has them, kernels/cpu/convert.cpp) gives the
// scalar rule's bits for every fp16 pattern and a stride through the fp32 patterns (subnormals,
// infinities and NaNs included), in long tensors (the vector path) with odd tails.
TEST(DTypeConvert, ConvertOpIsTheScalarRuleOnEveryPattern) {
  std::vector<uint16_t> h(65536 + 5);
  for (size_t i = 0; i < h.size(); ++i) h[i] = uint16_t(i);
  std::vector<float> wide(h.size());
  convert(host_tensor(wide.data(), {int64_t(h.size())}), Tensor(h.data(), DType::fp16, {int64_t(h.size())}));
  for (size_t i = 0; i < h.size(); ++i) ASSERT_TRUE(same(wide[i], fp16_to_fp32(h[i]))) << std::hex << h[i];
  std::vector<float> x;
  for (uint64_t bits = 0; bits < (uint64_t(1) << 32); bits += 65521) x.push_back(std::bit_cast<float>(uint32_t(bits)));
  for (uint32_t bits : {0x7f800000u, 0xff800000u, 0x7fc00001u, 0xffa00000u, 0x00000001u, 0x387fe000u, 0x477ff000u})
    x.push_back(std::bit_cast<float>(bits));
  const int64_t n = int64_t(x.size());
  std::vector<uint16_t> half(x.size()), brain(x.size());
  convert(Tensor(half.data(), DType::fp16, {n}), host_tensor(x.data(), {n}));
  convert(Tensor(brain.data(), DType::bf16, {n}), host_tensor(x.data(), {n}));
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(half[size_t(i)], fp32_to_fp16(x[size_t(i)])) << std::hex << std::bit_cast<uint32_t>(x[size_t(i)]);
    ASSERT_EQ(brain[size_t(i)], fp32_to_bf16(x[size_t(i)])) << std::hex << std::bit_cast<uint32_t>(x[size_t(i)]);
  }
}

// The CUDA kernel (kernels/cuda/convert.cu, CUDA's own conversions) gives the CPU's bits for every
// fp16 pattern and a stride through the fp32 patterns, in every direction; NaN stays NaN.
TEST(DTypeConvert, ConvertOnTheCudaDeviceIsTheScalarRule) {
  const CudaInfo cuda = cuda_info();
  if (!cuda.built || cuda.devices.empty()) GTEST_SKIP() << "no CUDA device (build with -DLLMTRAIN_CUDA=SIM)";
  std::vector<uint16_t> h(65536);
  for (size_t i = 0; i < h.size(); ++i) h[i] = uint16_t(i);
  std::vector<float> x;
  for (uint64_t bits = 0; bits < (uint64_t(1) << 32); bits += 262139) x.push_back(std::bit_cast<float>(uint32_t(bits)));
  for (uint32_t bits : {0x7f800000u, 0xff800000u, 0x00000001u, 0x387fe000u, 0x477ff000u, 0x3f808000u, 0x3f818000u})
    x.push_back(std::bit_cast<float>(bits));
  const int64_t nh = int64_t(h.size()), nx = int64_t(x.size());
  Buffer dh(DType::fp16, {nh}, Device::cuda), dwide(DType::fp32, {nh}, Device::cuda);
  Buffer dx(DType::fp32, {nx}, Device::cuda), dhalf(DType::fp16, {nx}, Device::cuda),
      dbrain(DType::bf16, {nx}, Device::cuda);
  Buffer dbrain_from_half(DType::bf16, {nh}, Device::cuda);
  copy(dh.tensor(), Tensor(h.data(), DType::fp16, {nh}));
  copy(dx.tensor(), host_tensor(x.data(), {nx}));
  convert(dwide.tensor(), dh.tensor());
  convert(dhalf.tensor(), dx.tensor());
  convert(dbrain.tensor(), dx.tensor());
  convert(dbrain_from_half.tensor(), dh.tensor());
  std::vector<float> wide(h.size());
  std::vector<uint16_t> half(x.size()), brain(x.size()), brain_from_half(h.size());
  copy(host_tensor(wide.data(), {nh}), dwide.tensor());
  copy(Tensor(half.data(), DType::fp16, {nx}), dhalf.tensor());
  copy(Tensor(brain.data(), DType::bf16, {nx}), dbrain.tensor());
  copy(Tensor(brain_from_half.data(), DType::bf16, {nh}), dbrain_from_half.tensor());
  for (size_t i = 0; i < h.size(); ++i) {
    ASSERT_TRUE(same(wide[i], fp16_to_fp32(h[i]))) << std::hex << h[i];
    const uint16_t want = fp32_to_bf16(fp16_to_fp32(h[i]));
    if (std::isnan(fp16_to_fp32(h[i])))
      ASSERT_TRUE(std::isnan(bf16_to_fp32(brain_from_half[i])));
    else
      ASSERT_EQ(brain_from_half[i], want) << std::hex << h[i];
  }
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) {
      ASSERT_TRUE(std::isnan(fp16_to_fp32(half[i])) && std::isnan(bf16_to_fp32(brain[i])));
      continue;
    }
    ASSERT_EQ(half[i], fp32_to_fp16(x[i])) << std::hex << std::bit_cast<uint32_t>(x[i]);
    ASSERT_EQ(brain[i], fp32_to_bf16(x[i])) << std::hex << std::bit_cast<uint32_t>(x[i]);
  }
}

}  // namespace llmtrain::kernels
