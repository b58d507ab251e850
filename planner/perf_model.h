// The performance model: a resolved recipe's step time on a cluster of catalogue devices, by
// part, without running anything (docs/plan.md §2 has the formulas).
//
//  - compute: each pipeline stage's FLOPs (its blocks, the embedding or the head) for forward,
//    backward and what activation recomputation repeats, over the device's achievable rate;
//  - tensor parallelism: the ring all-reduces (or, with sequence parallelism, all-gathers and
//    reduce-scatters of the same bytes) of every block's forward and backward, the embedding's,
//    the head's and the vocab-parallel loss's, on the critical path: what the run sends;
//  - pipeline: each micro-batch's activation send/recv added to its forward and backward, and the
//    schedule's bubble from the timeline simulator (parallel::simulate_step) at those durations;
//  - data parallelism / ZeRO: ring all-reduce, reduce-scatter and all-gather over the dp group,
//    across nodes when the group spans nodes, with what the backward hides of them;
//  - the optimizer: a memory-bound pass over the owned state; offloaded (parallel.offload), at
//    least the state's way to the update and back over the host link or the node's disk (nvme,
//    shared by its ranks), or with host's CPU update the gradients' and values' way and the
//    update at the host's memory bandwidth, at the assumed rates below (without clipping, less what
//    the last micro-batch's backward hides of it: the update then runs beside backward).
//
// Rule a reader could get wrong: the model predicts the time of one optimizer step in steady
// state; everything outside the step (data loading, logging, checkpoints) is not in it.
#pragma once

#include <string>

#include "common/recipe/recipe.h"
#include "planner/device_catalog.h"

namespace llmtrain::planner {

// Assumed rates for offloaded optimizer state: a PCIe 4.0 ×16 link's sustained copy rate per
// direction, one local NVMe drive's sequential rate, and a GPU node's host memory bandwidth (shared
// by its ranks' CPU updates).
inline constexpr double kHostLinkBandwidth = 25e9;
inline constexpr double kDiskBandwidth = 2e9;
inline constexpr double kHostMemoryBandwidth = 200e9;

struct Cluster {
  DeviceSpec device;
  int gpus = 1;                        // ranks in all
  int gpus_per_node = 8;               // ranks per node (NVLink domain)
  double inter_node_bandwidth = 50e9;  // bytes/s per rank and direction (its NIC: 400 Gb/s = 50 GB/s)
  // Whether the trainer stores each layer's attention scores ([heads, seq, seq] per sequence), as
  // Megatron-LM did before flash attention (its 2021 anchor). llmtrain's attention kernels, CPU and
  // CUDA, never do: the scores' bytes are then not part of the memory-bound traffic.
  bool stores_attention_scores = false;
};

// Ring collectives of `bytes` (the whole buffer) over `ranks` ranks at `bandwidth` bytes/s per
// rank and `latency` seconds per step: all-reduce 2(n−1)/n · bytes/bw + 2(n−1)·latency;
// reduce-scatter and all-gather (n−1)/n · bytes/bw + (n−1)·latency; one rank: 0.
double ring_all_reduce_time(double bytes, int ranks, double bandwidth, double latency);
double ring_reduce_scatter_time(double bytes, int ranks, double bandwidth, double latency);
double ring_all_gather_time(double bytes, int ranks, double bandwidth, double latency);

// The attention rates the model times a recipe's attention at: the kernel the run would take
// (kernels::cuda_attention_on_tensor_cores: the tensor cores' for bf16 and fp16 at head dims that
// are multiples of 16 up to 256, else the CUDA cores'), or none (0: at the products' rate) where the
// device has no rates of its own (cpu) or the cluster models stored attention scores.
struct AttentionRates {
  double forward = 0, backward = 0;
  std::string source;  // empty with no rates of its own
};
AttentionRates attention_rates(const Recipe& r, const Cluster& c);

struct StepPrediction {
  // Seconds per optimizer step, by part; total = compute + bubble + tp_comm + pp_comm + dp_comm +
  // optimizer, where compute, tp_comm and pp_comm are the busiest stage's.
  double compute = 0;
  double bubble = 0;   // the pipeline's idle time on the busiest stage
  double tp_comm = 0;  // tensor-parallel collectives (not overlapped), context parallelism's ring
                       // transfers not hidden behind attention or its all-to-alls, and expert
                       // parallelism's all-to-alls
  double pp_comm = 0;  // activation and gradient transfers between stages
  double dp_comm = 0;  // the data-parallel / ZeRO collectives the backward does not hide
  double optimizer = 0;
  double total = 0;
  // Bytes one tensor-parallel rank of the busiest stage sends per step in its tp collectives (ring
  // volumes: an all-reduce of B bytes over n ranks sends 2(n−1)/n·B; what parallel::CountingComm
  // counts in a run of the layout); 0 without tensor parallelism.
  double tp_bytes = 0;
  double tokens = 0;       // per step: global_batch × seq_len
  double model_flops = 0;  // the step's FLOPs by the model formula (6N + 12·L·d·T per token, docs/metrics.md)
  double flops_with_recompute = 0;  // plus what recomputation repeats (what the device computes)
  // The part other than compute that costs the most ("pipeline bubble", "tensor-parallel
  // communication", ...), or "compute" when no other part costs a tenth of the step.
  std::string limit;

  double model_flops_per_gpu(int gpus) const { return total > 0 ? model_flops / total / gpus : 0; }
  // Model FLOPs utilisation, predicted: model_flops_per_gpu over one GPU's rated peak
  // (DeviceSpec::rated_peak), as a fraction; docs/metrics.md's MFU of a run at this step time.
  double mfu(int gpus, double peak) const { return peak > 0 ? model_flops_per_gpu(gpus) / peak : 0; }
  double tokens_per_s_per_gpu(int gpus) const { return total > 0 ? tokens / total / gpus : 0; }
};

// One step of the resolved recipe's layout (tp, pp, dp, zero, micro-batch, recomputation, sequence
// parallelism, schedule) on `cluster` (cluster.gpus must equal the recipe's world size).
StepPrediction predict_step(const Recipe& recipe, const Cluster& cluster);

}  // namespace llmtrain::planner
