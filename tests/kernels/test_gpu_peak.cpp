// GPUs' rated peaks by device name (kernels/gpu_peak.cpp): the names the CUDA runtime reports map
// to their data sheets' dense figures, look-alike names do not collide, unknown devices are unknown.
#include <gtest/gtest.h>

#include "kernels/backend_info.h"

namespace llmtrain::kernels {
namespace {

TEST(GpuPeak, DeviceNamesMapToDenseRatedPeaks) {
  struct Case {
    const char* device_name;
    const char* model;
    double bf16_tflops, fp32_tflops;
  };
  const Case cases[] = {
      {"NVIDIA A100-SXM4-40GB", "A100 SXM4", 312, 19.5},
      {"NVIDIA A100-SXM4-80GB", "A100 SXM4", 312, 19.5},
      {"NVIDIA A100-PCIE-40GB", "A100 PCIe", 312, 19.5},
      {"NVIDIA A100 80GB PCIe", "A100 PCIe", 312, 19.5},
      {"NVIDIA H100 80GB HBM3", "H100 SXM", 989.5, 67},
      {"NVIDIA H100 PCIe", "H100 PCIe", 756.5, 51},
      {"NVIDIA H100 NVL", "H100 NVL", 835.5, 60},
      {"NVIDIA H200", "H200 SXM", 989.5, 67},
      {"NVIDIA H200 NVL", "H200 NVL", 835.5, 60},
      {"NVIDIA GH200 480GB", "GH200", 989.5, 67},
      {"NVIDIA A10", "A10", 125, 31.2},
      {"NVIDIA L4", "L4", 121, 30.3},
      {"NVIDIA L40S", "L40S", 362.05, 91.6},
      {"Tesla V100-SXM2-16GB", "V100 SXM2", 0, 15.7},
      {"Tesla V100-PCIE-32GB", "V100 PCIe", 0, 14},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.device_name);
    const std::optional<GpuPeak> p = gpu_peak_lookup(c.device_name);
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->model, c.model);
    EXPECT_DOUBLE_EQ(p->bf16_dense, c.bf16_tflops * 1e12);
    EXPECT_DOUBLE_EQ(p->fp32, c.fp32_tflops * 1e12);
    // Dense tensor-core bf16 is many times the CUDA cores' fp32 wherever there is bf16.
    if (p->bf16_dense > 0) {
      EXPECT_GT(p->bf16_dense, 3 * p->fp32);
    }
  }
}

TEST(GpuPeak, UnknownDevicesAreNotGuessed) {
  EXPECT_FALSE(gpu_peak_lookup(""));
  EXPECT_FALSE(gpu_peak_lookup("NVIDIA GeForce RTX 4090"));
  EXPECT_FALSE(gpu_peak_lookup("NVIDIA A10G"));  // not the A10
  EXPECT_FALSE(gpu_peak_lookup("NVIDIA L40"));   // not the L40S, not the L4
  EXPECT_FALSE(gpu_peak_lookup("Tesla V100S-PCIE-32GB"));
}

}  // namespace
}  // namespace llmtrain::kernels
