// Who started this process, read from the environment before MPI is initialised (docs/architecture.md §4
// "Who spawns"): a rank started by mpirun or by `srun --mpi=pmix` must not spawn anything; a plain
// process may launch ranks; a plain `srun` without PMIx (N separate one-rank worlds) is refused.
#pragma once

#include <string>

namespace llmtrain::parallel {

enum class Launcher {
  none,          // started by a user or script: may spawn ranks
  mpirun,        // Open MPI's mpirun/mpiexec (OMPI_COMM_WORLD_* set)
  srun_pmix,     // Slurm's srun with the PMIx plugin (PMIX_RANK set)
  srun_no_pmix,  // srun without an MPI plugin: every process would be a world of one
};

struct LaunchEnv {
  Launcher launcher = Launcher::none;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_size = 1;
  std::string slurm_job_id;  // set inside a Slurm allocation (batch script, salloc, srun)
  // srun --gpus-per-task (SLURM_GPUS_PER_TASK, srun_pmix only): the devices this rank sees are its
  // own, not shared with the other ranks of its node; 0 otherwise (kernels/device_select.h).
  int gpus_per_task = 0;

  bool is_rank() const { return launcher == Launcher::mpirun || launcher == Launcher::srun_pmix; }
  bool in_slurm_allocation() const { return !slurm_job_id.empty(); }
  // Where the world size came from, for messages: "mpirun (OMPI_COMM_WORLD_SIZE=4)".
  std::string world_source() const;
};

LaunchEnv detect_launch_env();

// Refuses, with the fix, a start that cannot make one job: a plain `srun` without PMIx (each
// process would be a world of one). The one place this rule lives; `llmtrain run` and
// parallel::bootstrap both call it.
void require_usable_launch(const LaunchEnv& env);

}  // namespace llmtrain::parallel
