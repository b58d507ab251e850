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

  bool active() const { return !job_id.empty(); }
  // The fewest CPUs any node of the allocation has (0 when unknown).
  int min_cpus_per_node() const;
};

SlurmAllocation slurm_allocation_from_env();

// Slurm's compressed count lists: "4(x2),2" -> {4, 4, 2}. Empty when malformed.
std::vector<int> parse_slurm_counts(std::string_view text);

}  // namespace llmtrain::launcher
