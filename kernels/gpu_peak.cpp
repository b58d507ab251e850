// GPUs' rated peaks by device name, the rate the CUDA backend's MFU is to be measured against
// (sources in docs/metrics.md, "MFU"). Built into every binary, CUDA or not: it is a pure function
// of the name. train.device: cuda is refused today, so nothing in training calls it yet; `llmtrain
// env` prints it beside each device.
//
// The rule a reader could get wrong: bf16 figures are dense (data sheets print them with 2:4
// sparsity, twice as high, beside or instead of the dense one), and the fp32 one is the CUDA
// cores' rate, not TF32 on the tensor cores. Names are matched by whole tokens: "A10" is not
// "A100", "H200" is not "GH200".
#include <string>
#include <vector>

#include "kernels/backend_info.h"

namespace llmtrain::kernels {

namespace {

// The name's tokens, upper case, split at spaces, dashes and underscores.
std::vector<std::string> name_tokens(std::string_view name) {
  std::vector<std::string> tokens(1);
  for (char c : name) {
    if (c == ' ' || c == '-' || c == '_') {
      if (!tokens.back().empty()) tokens.emplace_back();
    } else {
      tokens.back() += char(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
    }
  }
  if (tokens.back().empty()) tokens.pop_back();
  return tokens;
}

}  // namespace

std::optional<GpuPeak> gpu_peak_lookup(std::string_view device_name) {
  const std::vector<std::string> tokens = name_tokens(device_name);
  auto has = [&](std::string_view t) {
    for (const std::string& s : tokens)
      if (s == t) return true;
    return false;
  };
  constexpr double T = 1e12;
  if (has("GH200")) return GpuPeak{"GH200", 989.5 * T, 67 * T};
  if (has("H200")) return has("NVL") ? GpuPeak{"H200 NVL", 835.5 * T, 60 * T} : GpuPeak{"H200 SXM", 989.5 * T, 67 * T};
  if (has("H100")) {
    if (has("NVL")) return GpuPeak{"H100 NVL", 835.5 * T, 60 * T};
    if (has("PCIE")) return GpuPeak{"H100 PCIe", 756.5 * T, 51 * T};
    return GpuPeak{"H100 SXM", 989.5 * T, 67 * T};  // "NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB"
  }
  if (has("A100")) return GpuPeak{has("PCIE") ? "A100 PCIe" : "A100 SXM4", 312 * T, 19.5 * T};  // 40 and 80 GB alike
  if (has("A10")) return GpuPeak{"A10", 125 * T, 31.2 * T};
  if (has("L40S")) return GpuPeak{"L40S", 362.05 * T, 91.6 * T};
  if (has("L4")) return GpuPeak{"L4", 121 * T, 30.3 * T};
  if (has("V100")) {  // no bf16
    if (has("PCIE")) return GpuPeak{"V100 PCIe", 0, 14 * T};
    if (has("SXM2")) return GpuPeak{"V100 SXM2", 0, 15.7 * T};
  }
  return std::nullopt;
}

}  // namespace llmtrain::kernels
