// The supervisor: runs a LaunchPlan's job (mpirun or srun, which start the ranks) as a child
// process group, streams its output by rank (launcher/rank_output.h), forwards stop requests to
// every rank, and restarts a failed job from its newest complete checkpoint
// (launcher/restart_policy.h). `llmtrain run` calls it whenever the plan spawns ranks.
//
// Stopping (docs/launching.md "Signals"): the first SIGTERM, SIGINT or SIGHUP asks every rank to
// write a checkpoint and exit 75, and the ranks get `stop_grace_s` to do it before they are
// killed. How the request reaches the ranks depends on the mode:
//   local mpirun   SIGTERM straight to every rank process (mpirun's children);
//   mpirun over ssh, srun
//                  SIGUSR1 to mpirun/srun, which forward it to every rank on every host; the
//                  rank's relay (launcher/stop_relay.h) turns it into SIGTERM. Inside Slurm a
//                  SIGTERM is forwarded only while the job is RUNNING: when Slurm itself signals
//                  (scancel, time limit, preemption) the job is already CANCELLED/TIMEOUT/...
//                  and the ranks get Slurm's own SIGTERM — a second one would make them exit
//                  without a checkpoint.
// Later SIGTERMs/SIGHUPs are ignored (schedulers and scripts deliver repeats); a second SIGINT
// (Ctrl-C twice) kills the job at once.
//
// Hangs (docs/launching.md "Hangs"): the ranks report progress through their output (parallel/
// progress.h). When none has made progress for hang_timeout_s, the supervisor names the ranks
// behind and the collective each is in, asks every rank for its flight record (SIGUSR2), ends the
// attempt and treats it as failed.
//
// Rule a reader could get wrong: a stop request is never followed by a restart, whatever the job's
// status; and the supervisor never sends SIGTERM to mpirun or srun while the ranks are supposed to
// checkpoint (mpirun would kill them a second later, srun at once).
#pragma once

#include <string>

#include "common/recipe/recipe.h"
#include "launcher/launch_plan.h"

namespace llmtrain::launcher {

struct SupervisorOptions {
  std::string log_dir;          // <log.dir>; per-rank logs and launcher.log go to <log_dir>/logs/
  std::string checkpoint_dir;   // where a restart looks for the newest complete checkpoint
  int max_restarts = 0;         // launch.max_restarts
  double backoff_base_s = 1.0;  // restart k waits base × 2^(k-1) seconds ...
  double backoff_max_s = 60.0;  // ... at most this
  double stop_grace_s = 600.0;  // after a stop request: time for the ranks to checkpoint and exit
  // Restarts that happened before this supervisor started (Slurm's SLURM_RESTART_COUNT after a
  // requeue): when > 0, the first attempt is already a restart and resumes like one.
  int previous_restarts = 0;
  bool console = true;  // also print the ranks' output, tagged, on this process's stdout/stderr
  // Hang detection (parallel/progress.h): no rank making progress for this long ends the attempt,
  // which then counts as failed (restarted when max_restarts allows). 0 = off.
  double hang_timeout_s = 0;
  // While a rank saves or loads a checkpoint, the bound is at least this (checkpoint.timeout).
  double checkpoint_timeout_s = 1800;
};

// The options `llmtrain run` uses: from the recipe (log.dir, checkpoint.dir, launch.max_restarts)
// and the environment (SLURM_RESTART_COUNT).
SupervisorOptions supervisor_options(const Recipe& resolved);

// Runs the job until it finishes, fails for good or is stopped. Returns 0 (finished), 2 (user
// error: not restarted), 75 (interrupted with a checkpoint written), or the status of the last
// failed attempt (a rank's exit code, 128 + signal when a process was killed, 1 for an
// environment failure). Throws llmtrain::Error when the job cannot be started at all (the
// launcher program is missing, the log folder cannot be created).
int supervise(const LaunchPlan& plan, const SupervisorOptions& options);

}  // namespace llmtrain::launcher
