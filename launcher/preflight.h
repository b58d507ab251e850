// Pre-flight checks: everything that can be known to fail is refused before any rank starts, with
// the problem and the fix (docs/launching.md "Pre-flight checks"):
//  - the launcher program (mpirun, srun) and the rank program are there;
//  - enough CUDA devices for the ranks of this host (train.device: cuda);
//  - Slurm: the recipe's world fits the allocation (nodes, tasks, CPUs per node — srun would
//    otherwise wait forever for resources it cannot get);
//  - SSH: every host of the hostfile has slots for launch.procs_per_node ranks, the ssh options
//    can be passed through Open MPI, and every remote host answers `ssh <options> HOST true`
//    (ssh's own error is shown for those that do not);
//  - last, because it creates them: output folders (log.dir, checkpoint.dir) can be created and
//    written. A job refused by an earlier check leaves no run folder behind.
#pragma once

#include <string>

#include "common/recipe/recipe.h"
#include "launcher/launch_plan.h"

namespace llmtrain::launcher {

struct PreflightOptions {
  double ssh_timeout_s = 20.0;  // bound on the ssh probes (all hosts at once)
  bool check_devices = true;
};

// Throws llmtrain::Error (user kind for a recipe or setup the user must change, environment kind
// for a machine that is not ready) on the first problem class found, listing every instance of it.
void preflight_check(const Recipe& resolved, const LaunchPlan& plan, const PreflightOptions& options = {});

// The output-folder check alone (also for in-process runs): writes (and removes) a file in `dir`, or
// where `dir` would be created (its nearest existing ancestor, which must be a folder); creates
// nothing.
void check_writable_dir(const std::string& dir, const std::string& key);

// A CPU job's threads against this host's cores: "" when they fit, else the warning. `ranks` ×
// `threads` compute threads (ranks of this host, OpenMP threads each) on `cores` usable cores, with
// `others` threads runnable besides (another job, a build; -1: unknown). Oversubscribed threads wait
// on each other (they sleep after a short spin, GOMP_SPINCOUNT=1000, so it degrades gracefully, but steps slow and
// vary).
std::string oversubscription_warning(int ranks, int threads, int cores, int others);

// True when mpirun would start ranks for `host` on this machine without ssh ("localhost", this
// machine's name, or an address of one of its interfaces).
bool is_local_host(const std::string& host);

}  // namespace llmtrain::launcher
