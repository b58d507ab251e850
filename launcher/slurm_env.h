// The Slurm allocation this process runs in, read from the environment Slurm gives a batch script
// or an salloc shell (SLURM_JOB_ID, SLURM_JOB_NUM_NODES, SLURM_NTASKS, SLURM_JOB_CPUS_PER_NODE,
// ...). The launcher checks the recipe's world against it before starting `srun`, because srun
// asked for more tasks or CPUs than the allocation holds waits forever instead of failing.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace llmtrain::launcher {

struct SlurmAllocation {
  std::string job_id;              // "" outside an allocation
  std::string nodelist;            // SLURM_JOB_NODELIST
  int nodes = 0;                   // SLURM_JOB_NUM_NODES (SLURM_NNODES)
  int ntasks = 0;                  // SLURM_NTASKS; 0 when the allocation did not fix it
  int cpus_per_task = 0;           // SLURM_CPUS_PER_TASK; 0 when not given
  std::vector<int> cpus_per_node;  // SLURM_JOB_CPUS_PER_NODE expanded, one entry per node
  int restart_count = 0;           // SLURM_RESTART_COUNT: times the job was requeued
  // GPUs the allocation holds on each node (Slurm's gres): SLURM_GPUS_ON_NODE, else the ids in
  // SLURM_JOB_GPUS, else SLURM_GPUS_PER_NODE ("[type:]N"); 0 when it holds none Slurm knows of.
  int gpus_per_node = 0;
  std::string gpus_source;  // which variable said so, for messages: "SLURM_GPUS_ON_NODE=4"

  bool active() const { return !job_id.empty(); }
  // The fewest CPUs any node of the allocation has (0 when unknown).
  int min_cpus_per_node() const;
};

SlurmAllocation slurm_allocation_from_env();

// The GPUs per node from Slurm's variables (nullptr = unset), in the order above; 0 and "" when
// none says. Pure, for tests.
int slurm_gpus_per_node(const char* gpus_on_node, const char* job_gpus, const char* gpus_per_node, std::string* source);

// Slurm's compressed count lists: "4(x2),2" -> {4, 4, 2}. Empty when malformed.
std::vector<int> parse_slurm_counts(std::string_view text);

}  // namespace llmtrain::launcher
