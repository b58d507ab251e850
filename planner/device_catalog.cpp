#include "planner/device_catalog.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/file_io.h"
#include "common/host.h"
#include "common/json_depth.h"
#include "common/strings.h"
#include "kernels/backend_info.h"

namespace llmtrain::planner {
namespace {

constexpr double kT = 1e12, kG = 1e9;
constexpr int64_t kGiB = int64_t(1) << 30;

// What a training step's matrix products sustain on a GPU, as a fraction of the rated dense bf16
// peak (docs/plan.md §1: calibrated on Megatron-LM's Table 1 row without model parallelism, 1.7B
// on A100s, and used unchanged for every other row and device). The memory-bound ops between the
// products are timed apart, at the memory bandwidth (perf_model.cpp).
constexpr double kAchievableFraction = 0.6;
// Without tensor cores (fp32 storage and compute) the step is closer to the vector peak.
constexpr double kAchievableFp32Fraction = 0.7;
// What NCCL's ring collectives reach of NVLink's rated per-direction bandwidth (nccl-tests bus
// bandwidth on DGX A100 and H100 boards, docs/plan.md §1).
constexpr double kLinkFraction = 0.8;
// CUDA context, cuBLAS workspaces and NCCL's buffers: device memory outside our Buffers.
constexpr int64_t kReserved = 2 * kGiB;

// llmtrain's attention kernel as measured on one H100 80GB HBM3 (2026-11-24, commit bf47a3b,
// Nsight Compute over one fp32 step of GPT-2 124M at batch 8 × seq 1024, 12 heads of 64; the same
// kernel computes the bf16 step, in fp32, docs/benchmarks.md): forward 1.04 ms and backward 3.5 ms
// per layer, for 8192 · 4 · 12 · 64 · 1024 = 25.8 GFLOP forward and twice that backward as the
// performance model counts them. The kernel runs on the CUDA cores, so other GPUs' rates are these
// scaled by their fp32 vector peak against the H100's.
constexpr double kH100AttentionFlops = 8192.0 * 4 * 12 * 64 * 1024;
constexpr double kH100AttentionForward = kH100AttentionFlops / 1.04e-3;
constexpr double kH100AttentionBackward = 2 * kH100AttentionFlops / 3.5e-3;
constexpr double kH100Fp32 = 66.9 * kT;
// The tensor-core attention kernels (kernels/cuda/attention_tc.cu) have not run on a GPU yet: their
// rates are an assumption, fractions of the rated bf16 peak about half of what FlashAttention-2
// reaches on an H100 (some 300 TFLOP/s forward at seq 1k-2k, head dim 128: FlashAttention-3's paper,
// about 30% of the peak), as this first form keeps its accumulators in shared memory.
constexpr double kTensorCoreAttentionForward = 0.15;
constexpr double kTensorCoreAttentionBackward = 0.10;

DeviceSpec gpu(std::string name, std::string model, double bf16, double fp32, double memory_gib, double hbm,
               double nvlink_per_direction) {
  DeviceSpec d;
  d.name = std::move(name);
  d.model = std::move(model);
  d.rated_bf16 = bf16;
  d.rated_fp32 = fp32;
  d.achievable_bf16 = kAchievableFraction * bf16;
  d.achievable_fp32 = kAchievableFp32Fraction * fp32;
  d.memory = int64_t(memory_gib * double(kGiB));
  d.reserved = kReserved;
  d.memory_bandwidth = hbm;
  d.intra_node_bandwidth = kLinkFraction * nvlink_per_direction;
  d.intra_node_latency = 5e-6;
  d.inter_node_latency = 10e-6;
  d.rate_source = fmt::format("{:.0f}% of the rated bf16 peak", 100 * kAchievableFraction);
  d.attention_forward_rate = kH100AttentionForward * fp32 / kH100Fp32;
  d.attention_backward_rate = kH100AttentionBackward * fp32 / kH100Fp32;
  d.attention_source = fp32 == kH100Fp32 ? "llmtrain's attention kernel measured on an H100 (2026-11-24, bf47a3b)"
                                         : "llmtrain's attention kernel measured on an H100 (2026-11-24, bf47a3b), "
                                           "scaled by the fp32 vector peak";
  d.attention_tc_forward_rate = kTensorCoreAttentionForward * bf16;
  d.attention_tc_backward_rate = kTensorCoreAttentionBackward * bf16;
  d.attention_tc_source = fmt::format(
      "the tensor-core kernels' assumed {:.0f}% (forward) and {:.0f}% (backward) of the rated bf16 peak (no device "
      "run yet)",
      100 * kTensorCoreAttentionForward, 100 * kTensorCoreAttentionBackward);
  return d;
}

}  // namespace

std::vector<std::string> device_names() { return {"a100-40g", "a100-80g", "h100", "h200", "cpu"}; }

DeviceSpec device_lookup(const std::string& name, const Recipe* recipe) {
  // Memory as cudaMemGetInfo reports the total (a little under the marketing GB).
  if (name == "a100-40g") return gpu(name, "NVIDIA A100 SXM4 40GB", 312 * kT, 19.5 * kT, 39.4, 1555 * kG, 300 * kG);
  if (name == "a100-80g") return gpu(name, "NVIDIA A100 SXM4 80GB", 312 * kT, 19.5 * kT, 79.2, 2039 * kG, 300 * kG);
  if (name == "h100") return gpu(name, "NVIDIA H100 SXM5 80GB", 989.4 * kT, 66.9 * kT, 79.6, 3350 * kG, 450 * kG);
  if (name == "h200") return gpu(name, "NVIDIA H200 SXM 141GB", 989.4 * kT, 66.9 * kT, 139.8, 4800 * kG, 450 * kG);
  if (name == "cpu") return cpu_device(recipe);
  throw Error(fmt::format("unknown device '{}'", name),
              fmt::format("the catalogue holds {} (docs/plan.md)", join(device_names(), ", ")));
}

DeviceSpec device_memory(const std::string& name) {
  if (name != "cpu") return device_lookup(name);
  DeviceSpec d;
  d.name = "cpu";
  d.model = "this machine";
  d.memory = host_info().memory_total;
  d.shares_host = true;
  return d;
}

DeviceSpec cpu_device(const Recipe* recipe) {
  std::vector<kernels::GemmShape> shapes{{512, 512, 512}, {512, 1024, 256}, {512, 256, 1024}};
  if (recipe != nullptr) {
    const ModelConfig& m = recipe->model;
    const int64_t rows = int64_t(recipe->train.micro_batch) * m.seq_len, d = m.hidden;
    shapes = {{rows, (m.heads + 2 * int64_t(m.kv_heads)) * m.head_size(), d},
              {rows, m.ffn_hidden, d},
              {rows, d, m.ffn_hidden},
              {rows, m.padded_vocab(), d}};
  }
  const HostInfo host = host_info();
  const int threads = std::max(1, host.cores_usable);
  DeviceSpec d;
  d.name = "cpu";
  d.model = host.cpu_model.empty() ? "this machine's CPU" : host.cpu_model;
  const kernels::CpuPeak rated = kernels::cpu_peak_derive(kernels::cpu_facts_read(threads));
  // The best of at least 5 rounds and of a quarter of a second of them (at most 50): load only lowers
  // a round's rate, and a longer window is likelier to hold a quiet moment on a shared host. One
  // thread first (what each rank of a multi-rank run on this host computes with; it needs only one
  // quiet core, where the all-cores rate collapses whenever any other process holds a core), then
  // all cores, which stay set.
  auto best_rate = [&](int t) {
    kernels::set_cpu_threads(t);
    double gflops = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int round = 0; round < 50; ++round) {
      gflops = std::max(gflops, kernels::sgemm_best_gflops(shapes, 1));
      if (round >= 4 && std::chrono::steady_clock::now() - start > std::chrono::milliseconds(250)) break;
    }
    return gflops * kG;
  };
  d.achievable_one_thread = threads > 1 ? best_rate(1) : 0;
  d.achievable_fp32 = best_rate(threads);
  if (threads == 1) d.achievable_one_thread = d.achievable_fp32;
  d.cores = threads;
  d.achievable_bf16 = d.achievable_fp32;  // 16-bit operands are widened and computed in fp32
  d.rated_fp32 = rated.flops > 0 ? rated.flops : d.achievable_fp32;
  d.rated_bf16 = d.rated_fp32;
  d.memory = host.memory_total;
  d.reserved = 0;
  // Stated, not measured: a host's memory bandwidth for the optimizer's pass and MPI's
  // shared-memory transport between its ranks (docs/plan.md §1).
  d.memory_bandwidth = 10 * kG;
  d.intra_node_bandwidth = 2 * kG;
  d.intra_node_latency = 20e-6;
  d.inter_node_latency = 50e-6;
  d.shares_host = true;
  d.rate_source = threads == 1 ? std::string("sgemm measured on 1 thread")
                               : fmt::format("sgemm measured on {} threads and on 1", threads);
  return d;
}

void apply_measured_rates(DeviceSpec& device, const std::string& path) {
  if (device.shares_host || device.name == "cpu")
    throw Error(fmt::format("--rates {}: the cpu row's rates are measured on this machine already", printable(path)),
                "give --rates with a GPU (--gpu h100, ...)");
  constexpr int64_t kMaxRatesFile = 64 * 1024;
  apply_measured_rates_text(device, read_file(path, kMaxRatesFile), fmt::format("--rates {}", printable(path)));
}

void apply_measured_rates_text(DeviceSpec& device, std::string_view text, const std::string& where) {
  require_json_depth(text, where, 4);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: not JSON: {}", where, e.what()),
                "give the file tests/bench/device_rates writes (scripts/gpu_check.sh keeps it as rates.json)");
  }
  if (!j.is_object() || !j.contains("llmtrain_device_rates"))
    throw Error(fmt::format("{}: not a device-rates file (no llmtrain_device_rates key)", where),
                "give the file tests/bench/device_rates writes (scripts/gpu_check.sh keeps it as rates.json)");
  auto rate = [&](const char* key) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number())
      throw Error(fmt::format("{}: {} is missing or not a number", where, key), "rerun tests/bench/device_rates");
    const double v = it->get<double>();
    // Below a megaFLOP/s no device is measured (5e-324 would make every predicted step infinite).
    if (!std::isfinite(v) || v < 1e6 || v >= 1e18)
      throw Error(fmt::format("{}: {} is {}, expected a rate in FLOP/s from 1e6 to 1e18", where, key, v),
                  "rerun tests/bench/device_rates");
    return v;
  };
  auto text_of = [&](const char* key) {
    const auto it = j.find(key);
    return it != j.end() && it->is_string() ? printable(it->get<std::string>().substr(0, 200)) : std::string("?");
  };
  const double forward = rate("attention_forward_rate"), backward = rate("attention_backward_rate");
  const double bf16 = rate("products_bf16"), fp32 = rate("products_fp32");
  device.attention_forward_rate = forward, device.attention_backward_rate = backward;
  device.achievable_bf16 = bf16, device.achievable_fp32 = fp32;
  const std::string source =
      fmt::format("measured on {} ({}, commit {})", text_of("device"), text_of("date"), text_of("commit"));
  device.rate_source = "the products' rate " + source;
  device.attention_source = "llmtrain's attention kernel " + source;
  if (j.contains("attention_tc_forward_rate") || j.contains("attention_tc_backward_rate")) {
    device.attention_tc_forward_rate = rate("attention_tc_forward_rate");
    device.attention_tc_backward_rate = rate("attention_tc_backward_rate");
    device.attention_tc_source = "the tensor-core attention kernels " + source;
  }
}

}  // namespace llmtrain::planner
