// `llmtrain sbatch`: the batch script that runs a recipe on a Slurm cluster (docs/launching.md
// "Slurm"). Inside the allocation the script's `llmtrain run` sees SLURM_JOB_ID and starts the
// ranks with `srun --mpi=pmix`; the script handles the job's life around it:
//  - `--signal=TERM@<margin>`: Slurm sends the ranks SIGTERM <margin> seconds before the time
//    limit, so they write a checkpoint and exit 75 before the limit kills them;
//  - `--requeue` and, when `llmtrain run` exits 75, `scontrol requeue $SLURM_JOB_ID`: the job goes
//    back to the queue and resumes from its checkpoint (the supervisor sees SLURM_RESTART_COUNT);
//  - `--open-mode=append`: the requeued job appends to the same output file.
//
// Rule a reader could get wrong: bash runs a trap only between commands, never while it waits for
// a foreground child, so the script starts `llmtrain run` in the background and `wait`s for it,
// waiting again after each trapped signal until the child has really exited.
#pragma once

#include <string>
#include <vector>

#include "common/recipe/recipe.h"

namespace llmtrain::launcher {

// Seconds before the time limit at which Slurm asks the ranks to stop: one training step plus a
// checkpoint write on a large model take minutes, and Slurm delivers the signal up to about a
// minute off the requested time (its timer runs every ~30 s).
inline constexpr int kDefaultSignalMarginS = 300;

struct SbatchRequest {
  std::string llmtrain;                   // absolute path of the llmtrain binary the job runs
  std::string recipe;                     // absolute path of the recipe
  std::string workdir;                    // where relative paths of the recipe resolve (--chdir)
  std::vector<std::string> overrides;     // the user's --set key=value, in order
  std::vector<std::string> rank_command;  // `-- PROGRAM ARGS`: ranks run this instead of training
  int nodes = 0;                          // 0: not given (the recipe's launch.nodes)
  int gpus_per_node = -1;                 // -1: not given (cuda: one per rank; cpu: none)
  int cpus_per_task = 0;                  // 0: train.threads when set, else whole nodes (--exclusive)
  std::string time;                       // "" = launch.slurm.time
  std::string partition;                  // "" = launch.slurm.partition
  std::string account;                    // "" = launch.slurm.account
  int signal_margin_s = kDefaultSignalMarginS;
  std::string version;  // llmtrain's version, for the header
};

// The script's text. Throws llmtrain::Error for requests that cannot work (a hostfile recipe,
// fewer GPUs per node than ranks per node with train.device cuda).
std::string sbatch_script(const Recipe& resolved, const SbatchRequest& request);

// Where the job's output goes: <log.dir>/slurm-%j.out (Slurm fills in %j).
std::string sbatch_output_pattern(const Recipe& resolved);

}  // namespace llmtrain::launcher
