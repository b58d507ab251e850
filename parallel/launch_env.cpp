#include "parallel/launch_env.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "common/error.h"
#include "common/strings.h"

namespace llmtrain::parallel {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int env_int(const char* name, int fallback) {
  const char* v = env(name);
  if (!v) return fallback;
  const auto n = parse_int64(v);  // a rank count or index: anything beyond int is malformed
  return n && *n >= INT32_MIN && *n <= INT32_MAX ? static_cast<int>(*n) : fallback;
}

}  // namespace

LaunchEnv detect_launch_env() {
  LaunchEnv e;
  if (const char* job = env("SLURM_JOB_ID")) e.slurm_job_id = job;
  if (env("OMPI_COMM_WORLD_SIZE")) {
    e.launcher = Launcher::mpirun;
    e.world_size = env_int("OMPI_COMM_WORLD_SIZE", 1);
    e.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
    e.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    e.local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  } else if (env("PMIX_RANK") && env("SLURM_STEP_ID")) {
    e.launcher = Launcher::srun_pmix;
    e.rank = env_int("PMIX_RANK", env_int("SLURM_PROCID", 0));
    e.world_size = env_int("SLURM_NTASKS", env_int("SLURM_NPROCS", 1));
    e.local_rank = env_int("SLURM_LOCALID", 0);
    // SLURM_TASKS_PER_NODE may be "4(x2)"; the local count is the step's tasks on this node.
    e.local_size = env_int("SLURM_STEP_TASKS_PER_NODE", env_int("SLURM_NTASKS_PER_NODE", 1));
    e.gpus_per_task = std::max(0, env_int("SLURM_GPUS_PER_TASK", 0));
  } else if (env("SLURM_STEP_ID") && env("SLURM_PROCID") && env_int("SLURM_NTASKS", 1) > 1) {
    e.launcher = Launcher::srun_no_pmix;
    e.rank = env_int("SLURM_PROCID", 0);
    e.world_size = env_int("SLURM_NTASKS", 1);
  }
  return e;
}

void require_usable_launch(const LaunchEnv& env) {
  if (env.launcher != Launcher::srun_no_pmix) return;
  throw Error(fmt::format("started by srun without PMIx: each of the {} processes (SLURM_NTASKS={}) would be a "
                          "separate one-rank job",
                          env.world_size, env.world_size),
              "run `srun --mpi=pmix llmtrain run ...`, or set MpiDefault=pmix in slurm.conf");
}

std::string LaunchEnv::world_source() const {
  switch (launcher) {
    case Launcher::mpirun:
      return fmt::format("mpirun (OMPI_COMM_WORLD_SIZE={})", world_size);
    case Launcher::srun_pmix:
      return fmt::format("srun --mpi=pmix (SLURM_NTASKS={})", world_size);
    case Launcher::srun_no_pmix:
      return fmt::format("srun without PMIx (SLURM_NTASKS={})", world_size);
    case Launcher::none:
      break;
  }
  return "this process alone";
}

}  // namespace llmtrain::parallel
