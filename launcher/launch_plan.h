// Turning a recipe into a plan for starting ranks: how many, through which program, with which
// command line and environment. Pure apart from reading launch.hostfile: it inspects the recipe and
// the facts it is given and spawns nothing, so `run --dry-run` prints exactly what `run` executes
// (the supervisor, launcher/supervisor.h, only appends restart overrides to the rank arguments).
//
// Rule a reader could get wrong: the world size comes from the recipe (launch.nodes ×
// launch.procs_per_node, or hosts × procs_per_node with a hostfile) when this process spawns the
// ranks, and from the environment when it is one of them; planned_world() is the one place that
// decides, and recipe resolution (dp: auto) uses it.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/recipe/recipe.h"
#include "common/recipe/recipe_check.h"
#include "launcher/hostfile.h"
#include "launcher/slurm_env.h"
#include "parallel/launch_env.h"

namespace llmtrain::launcher {

enum class LaunchMode {
  in_process,    // one rank: this process trains
  as_rank,       // this process is already one rank of an mpirun/srun job
  local_mpirun,  // launch.procs_per_node ranks on this host through mpirun
  slurm_srun,    // inside a Slurm allocation: srun --mpi=pmix
  ssh_mpirun,    // launch.hostfile: mpirun over ssh
};

const char* to_string(LaunchMode mode);

// Everything besides the recipe that the plan depends on; plan_inputs() reads it from this
// process and machine, tests fill it by hand.
struct PlanInputs {
  parallel::LaunchEnv env;
  SlurmAllocation slurm;      // active() inside an allocation
  int cores = 1;              // CPUs this process may use (its affinity mask)
  bool root = false;          // Open MPI refuses root unless told it is intended
  bool cma_available = true;  // cross-memory attach (process_vm_readv) works; containers often block it
  bool rank_program = false;  // ranks run a program other than `llmtrain run` (`run RECIPE -- PROGRAM ...`)
  // Variables mpirun passes on to every rank, also on other hosts (`-x NAME`): CUDA_VISIBLE_DEVICES,
  // LLMTRAIN_SIM_DEVICES and every NCCL_* variable set in this process's environment.
  std::vector<std::string> forwarded_env;
};

PlanInputs plan_inputs(const parallel::LaunchEnv& env, bool rank_program = false);

// The world size the job will have, known before the recipe is resolved (dp: auto needs it).
// Reads launch.hostfile (relative to the current directory) when one is set and this process is
// not a rank; throws llmtrain::Error when it is unreadable or malformed.
WorldInfo planned_world(const Recipe& recipe, const parallel::LaunchEnv& env);

using EnvList = std::vector<std::pair<std::string, std::string>>;

struct LaunchPlan {
  LaunchMode mode = LaunchMode::in_process;
  int world_size = 1;
  int nodes = 1;
  int ranks_per_node = 1;
  int threads_per_rank = 1;
  // The launcher program, its options, then rank_argv. Empty for in_process / as_rank.
  std::vector<std::string> command;
  std::vector<std::string> rank_argv;  // what every rank runs
  // Set in the launcher program's environment (mpirun passes them on to the ranks it starts).
  EnvList env;
  // Why the plan chose what it chose, one line each ("4 ranks on 2 cores: oversubscribed, ...").
  std::vector<std::string> notes;
  std::vector<HostfileEntry> hosts;  // ssh_mpirun: the hostfile's hosts
  // Why this plan cannot run from here ("" when it can), with the way out in `blocker_hint`.
  std::string blocker;
  std::string blocker_hint;

  bool spawns() const {
    return mode == LaunchMode::local_mpirun || mode == LaunchMode::slurm_srun || mode == LaunchMode::ssh_mpirun;
  }
  std::string command_line() const;  // shell-quoted
  std::string env_line() const;      // "K=V K=V", shell-quoted
  // `command` with extra arguments for every rank (restart overrides) appended.
  std::vector<std::string> command_with(const std::vector<std::string>& extra_rank_args) const;
};

// `rank_argv`: the arguments each rank runs (path of this executable, "run", the recipe, --set...).
LaunchPlan plan_launch(const Recipe& resolved, const PlanInputs& inputs, const std::vector<std::string>& rank_argv);
LaunchPlan plan_launch(const Recipe& resolved, const parallel::LaunchEnv& env,
                       const std::vector<std::string>& rank_argv);

std::string shell_quote(const std::string& arg);

// The names forwarded_env holds, from an environment's "NAME=value" entries (environ): names that
// are not [A-Za-z_][A-Za-z0-9_]* are left out (mpirun's -x could not pass them).
std::vector<std::string> forwarded_env_names(const char* const* environ_entries);

// The names of the environment variables the supervisor sets for every attempt and mpirun
// exports to every rank (`-x`): the restart count, as torchrun's TORCHELASTIC_RESTART_COUNT.
inline constexpr const char* kRestartCountEnv = "LLMTRAIN_RESTART_COUNT";
// The job every attempt of one `llmtrain run` belongs to ("<host>:<pid>:<start>"), for the
// checkpoint directory's lock (common/checkpoint_dir.h): a restart takes over its own job's lock.
inline constexpr const char* kJobEnv = "LLMTRAIN_JOB";

}  // namespace llmtrain::launcher
