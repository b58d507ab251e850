// The device catalogue the planner predicts with (docs/plan.md §1 is the same table with its
// sources): per device its rated and achievable compute, its memory and what of it our Buffers
// cannot use, its memory bandwidth, and the links between devices inside and across nodes.
//
// Rule a reader could get wrong: "achievable" is not a GEMM benchmark's best but what a training
// step's matrix products (and attention's) sustain on one device: the performance model divides
// their FLOPs by it and times the memory-bound ops between them apart, at memory_bandwidth. The
// GPUs' figures are a stated fraction of the rated peak (docs/plan.md says where the fraction comes
// from); the CPU's is measured on this machine (sgemm at a small model's shapes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/recipe/recipe.h"

namespace llmtrain::planner {

struct DeviceSpec {
  std::string name;             // catalogue name: "a100-80g", "h100", "cpu"
  std::string model;            // "NVIDIA A100 SXM4 80GB"
  double rated_bf16 = 0;        // FLOP/s, dense (cpu: its fp32 peak, which its 16-bit ops compute in)
  double rated_fp32 = 0;        // FLOP/s without tensor cores
  double achievable_bf16 = 0;   // FLOP/s a training step's products sustain (see above)
  double achievable_fp32 = 0;   // the same with fp32 storage
  int64_t memory = 0;           // bytes per device (cpu: the host's, shared by its ranks)
  int64_t reserved = 0;         // bytes outside our Buffers: CUDA context, cuBLAS and NCCL workspaces
  double memory_bandwidth = 0;  // bytes/s
  double intra_node_bandwidth =
      0;                          // bytes/s per device and direction (NVLink through NVSwitch; cpu: MPI shared memory)
  double intra_node_latency = 0;  // seconds per message step
  double inter_node_latency = 0;
  bool shares_host = false;  // cpu: the ranks of a node share its cores and its memory
  // cpu only: the usable cores, and the sgemm rate of one thread (a rank of one thread computes at
  // it while the other cores run the other ranks; achievable_* are the rates of all cores at once).
  int cores = 0;
  double achievable_one_thread = 0;
  std::string rate_source;  // how achievable was found
  // llmtrain's own attention kernels on this device: the FLOPs the performance model counts for
  // attention (4·heads·head_dim·seq per token forward, twice that backward) over the time a kernel
  // takes. attention_*: the CUDA cores' (fp32 arithmetic; fp32 storage, and the head dims the
  // tensor-core kernels do not take), measured; attention_tc_*: the tensor cores' (bf16 and fp16
  // storage, kernels::cuda_attention_on_tensor_cores), assumed until a device run measures them.
  // 0 (cpu) = at the products' rate.
  double attention_forward_rate = 0, attention_backward_rate = 0;
  std::string attention_source;  // where the attention rates come from (a GPU run: date, commit, how)
  double attention_tc_forward_rate = 0, attention_tc_backward_rate = 0;
  std::string attention_tc_source;

  // The rated dense peak a run's MFU is measured against at `precision` (docs/metrics.md, "MFU"):
  // rated_fp32 for fp32, else rated_bf16 (fp16's dense tensor-core peak is bf16's on these GPUs).
  double rated_peak(Precision precision) const { return precision == Precision::fp32 ? rated_fp32 : rated_bf16; }
};

// The catalogue's names: a100-40g, a100-80g, h100, h200, cpu.
std::vector<std::string> device_names();
// The GPUs' rows; throws llmtrain::Error naming the catalogue for an unknown name. "cpu" is
// cpu_device() at the recipe's matrix shapes (without a recipe: 512-wide ones).
DeviceSpec device_lookup(const std::string& name, const Recipe* recipe = nullptr);
// This machine: its memory, its rated fp32 peak (kernels' cpu_peak) and the measured sgemm rates of
// all its usable cores and of one thread at the products of `recipe`'s model (one micro-batch's
// rows, no tensor parallelism; about half a second); achievable_bf16 = achievable_fp32 (16-bit ops
// compute in fp32 on the CPU).
DeviceSpec cpu_device(const Recipe* recipe);
// A device's memory fields only (memory, reserved, shares_host), without measuring anything: what
// a memory check needs. The rates of the cpu row are 0 here; use device_lookup for predictions.
DeviceSpec device_memory(const std::string& name);

// Replaces a GPU row's rates by those measured on a device (`llmtrain plan --rates FILE`, `run
// --dry-run --rates FILE`): the JSON object tests/bench/device_rates writes (scripts/gpu_check.sh
// runs it), whose attention_forward_rate, attention_backward_rate, products_bf16 and products_fp32
// (FLOP/s) become the row's attention rates and achievable rates, and attention_tc_forward_rate and
// attention_tc_backward_rate, where the file has them (runs since the tensor-core kernels), its
// tensor-core attention rates; rate_source and the attention sources name the device, date and
// commit it records. The file may be hostile: at most 64 KiB, every rate
// a finite number in (0, 1e18), strings printable; anything else is an llmtrain::Error naming the
// file and the key. Refused for the cpu row, whose rates are measured on this machine anyway.
void apply_measured_rates(DeviceSpec& device, const std::string& path);
// The same on the file's text; `where` names it in errors ("--rates rates.json").
void apply_measured_rates_text(DeviceSpec& device, std::string_view text, const std::string& where);

}  // namespace llmtrain::planner
