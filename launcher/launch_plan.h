// Turning a recipe into a plan for starting ranks: how many, through which program, with which
// command line. Pure: it inspects the recipe and the environment and spawns nothing, so
// `run --dry-run` prints exactly what `run` would execute.
#pragma once

#include <string>
#include <vector>

#include "parallel/launch_env.h"
#include "trainer/recipe.h"
#include "trainer/recipe_check.h"

namespace llmtrain::launcher {

enum class LaunchMode {
  in_process,    // one rank: this process trains
  as_rank,       // this process is already one rank of an mpirun/srun job
  local_mpirun,  // launch.procs_per_node ranks on this host through mpirun
  slurm_srun,    // inside a Slurm allocation: srun --mpi=pmix
  ssh_mpirun,    // launch.hostfile: mpirun over ssh
};

const char* to_string(LaunchMode mode);

// The world size the job will have, known before the recipe is resolved (dp: auto needs it).
trainer::WorldInfo planned_world(const trainer::Recipe& recipe, const parallel::LaunchEnv& env);

struct LaunchPlan {
  LaunchMode mode = LaunchMode::in_process;
  int world_size = 1;
  int ranks_per_node = 1;
  int threads_per_rank = 1;
  std::vector<std::string> command;  // empty for in_process / as_rank
  // Why this plan cannot run from here ("" when it can), with the way out in `blocker_hint`.
  std::string blocker;
  std::string blocker_hint;

  std::string command_line() const;  // shell-quoted
};

// `rank_argv`: the arguments each rank runs (path of this executable, "run", the recipe, --set...).
LaunchPlan plan_launch(const trainer::Recipe& resolved, const parallel::LaunchEnv& env,
                       const std::vector<std::string>& rank_argv);

std::string shell_quote(const std::string& arg);

}  // namespace llmtrain::launcher
