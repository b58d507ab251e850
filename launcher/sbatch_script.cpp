#include "launcher/sbatch_script.h"

#include <fmt/format.h>

#include "common/error.h"
#include "common/strings.h"
#include "launcher/launch_plan.h"

namespace llmtrain::launcher {
namespace {

// A value for a '#' line of the script (a comment or an #SBATCH option): a line break would end
// the line, and the next one would run on the compute node.
void require_one_line(const char* what, const std::string& value) {
  const std::string problem = text_problem(value);
  if (!problem.empty())
    throw Error(fmt::format("{} holds {}: it cannot be written into an sbatch script", what, problem),
                "give a value of one line without control characters");
}

}  // namespace

std::string sbatch_output_pattern(const Recipe& r) { return r.log.dir + "/slurm-%j.out"; }

std::string sbatch_script(const Recipe& r, const SbatchRequest& q) {
  if (!r.launch.hostfile.empty())
    throw Error(
        fmt::format("launch.hostfile is set ({}), but in a Slurm job Slurm chooses the nodes", r.launch.hostfile),
        "remove launch.hostfile for Slurm (--set launch.hostfile=null)");
  const int nodes = q.nodes > 0 ? q.nodes : r.launch.nodes;
  if (nodes < 1) throw Error(fmt::format("--nodes must be at least 1, found {}", nodes));
  if (q.signal_margin_s < 1)
    throw Error(fmt::format("--signal-margin must be at least 1 second, found {}", q.signal_margin_s));
  const int ppn = r.launch.procs_per_node;
  const bool cuda = r.train.device == DeviceKind::cuda;
  int gpus = q.gpus_per_node >= 0 ? q.gpus_per_node : cuda ? ppn : 0;
  if (cuda && (gpus < 1 || (gpus < ppn && !r.launch.share_devices)))
    throw Error(fmt::format("train.device is cuda with launch.procs_per_node {} ranks per node, but --gpus-per-node "
                            "is {}",
                            ppn, gpus),
                gpus < 1 ? "a cuda run needs GPUs: give --gpus-per-node at least 1"
                         : "each rank needs its own GPU: --gpus-per-node must be at least launch.procs_per_node, or "
                           "let ranks share devices with launch.share_devices: true");
  const int cpus_per_task = q.cpus_per_task > 0 ? q.cpus_per_task : r.train.threads;
  const std::string time = q.time.empty() ? r.launch.slurm.time : q.time;
  const std::string partition = q.partition.empty() ? r.launch.slurm.partition : q.partition;
  const std::string account = q.account.empty() ? r.launch.slurm.account : q.account;
  require_one_line("--time", time);
  require_one_line("--partition", partition);
  require_one_line("--account", account);
  require_one_line("the recipe's path", q.recipe);
  require_one_line("the current directory", q.workdir);
  require_one_line("name", r.name);
  require_one_line("log.dir", r.log.dir);

  std::string run = shell_quote(q.llmtrain) + " run " + shell_quote(q.recipe);
  std::vector<std::string> sets = q.overrides;
  sets.push_back(fmt::format("launch.nodes={}", nodes));
  for (const auto& s : sets) run += " \\\n    --set " + shell_quote(s);
  if (!q.rank_command.empty()) {
    run += " \\\n    --";
    for (const auto& a : q.rank_command) run += " " + shell_quote(a);
  }

  std::string s;
  s += "#!/bin/bash\n";
  s += fmt::format("# Written by `llmtrain sbatch` (llmtrain {}) for recipe '{}' ({}).\n", q.version, r.name, q.recipe);
  s += "#   submit:                       sbatch THIS_FILE   (or `llmtrain sbatch ... --submit`)\n";
  s += "#   checkpoint, stop and requeue: scancel --signal=TERM JOBID\n";
  s += "#   checkpoint and end:           scancel JOBID\n";
  s += fmt::format("# {} nodes × {} ranks = {} ranks, started by `srun --mpi=pmix` inside the job.\n", nodes, ppn,
                   nodes * ppn);
  s += fmt::format("#SBATCH --job-name={}\n", shell_quote("llmtrain-" + r.name));
  s += fmt::format("#SBATCH --nodes={}\n", nodes);
  s += fmt::format("#SBATCH --ntasks-per-node={}\n", ppn);
  if (cpus_per_task > 0)
    s += fmt::format("#SBATCH --cpus-per-task={}\n", cpus_per_task);
  else
    s += "#SBATCH --exclusive              # whole nodes: threads per rank = the node's CPUs / ranks per node\n";
  if (gpus > 0) {
    std::string why;  // how the ranks use them (srun inside the job: launch_plan.cpp)
    if (cuda && gpus < ppn)
      why = fmt::format("    # launch.share_devices: each rank takes GPU local_rank mod {}", gpus);
    else if (cuda)
      why = r.launch.share_devices ? "    # srun gives the ranks of a node these GPUs to share"
                                   : "    # srun gives each rank one of them (--gpus-per-task=1)";
    s += fmt::format("#SBATCH --gpus-per-node={}{}\n", gpus, why);
  }
  if (!time.empty()) s += fmt::format("#SBATCH --time={}\n", time);
  if (!partition.empty()) s += fmt::format("#SBATCH --partition={}\n", shell_quote(partition));
  if (!account.empty()) s += fmt::format("#SBATCH --account={}\n", shell_quote(account));
  s += fmt::format(
      "#SBATCH --signal=TERM@{}          # ranks get SIGTERM {}s before the time limit: checkpoint, exit 75\n",
      q.signal_margin_s, q.signal_margin_s);
  s += "#SBATCH --requeue\n";
  s += "#SBATCH --open-mode=append       # a requeued job appends to the same output file\n";
  s += fmt::format("#SBATCH --output={}\n", shell_quote(sbatch_output_pattern(r)));
  s += fmt::format("#SBATCH --chdir={}\n", shell_quote(q.workdir));
  s += R"SH(set -u
echo "[sbatch] job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NODELIST:-?} at $(date -Is)"

# A SIGTERM for this script alone (scancel --batch, --signal=B:TERM, a preemption) goes on to
# llmtrain run, which asks the ranks to checkpoint; it ignores the copy when Slurm signals the ranks
# itself. bash runs the trap only between commands, hence `cmd & wait` below.
trap 'echo "[sbatch] SIGTERM: passing it to llmtrain run"; kill -TERM "$child" 2>/dev/null' TERM

)SH";
  s += run + " &\n";
  s += R"SH(child=$!
while :; do
  wait "$child"; status=$?
  if ((status > 128)); then
    # `wait` returns 128+N when a trapped signal interrupts it: wait again while the child lives.
    if kill -0 "$child" 2>/dev/null; then continue; fi
    wait "$child" 2>/dev/null; again=$?
    ((again != 127)) && status=$again
  fi
  break
done
echo "[sbatch] llmtrain run exited $status at $(date -Is)"
if ((status == 75)); then
  # Requeue only a job that is still RUNNING: stopped by --signal=TERM@margin before its time limit,
  # by `scancel --signal=TERM`, or by a SIGTERM for this script. A job Slurm is ending (scancel,
  # the time limit itself, preemption) shows COMPLETING and stays ended.
  state=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)
  if [[ $state == RUNNING ]]; then
    echo "[sbatch] interrupted with a checkpoint written: requeueing job $SLURM_JOB_ID to resume"
    scontrol requeue "$SLURM_JOB_ID" ||
      echo "[sbatch] the requeue failed: submit this script again to resume from the checkpoint"
  else
    echo "[sbatch] checkpoint written; not requeued: Slurm is ending job $SLURM_JOB_ID (JobState=${state:-unknown}:" \
      "scancel, time limit or preemption); submit this script again to resume"
  fi
fi
exit "$status"
)SH";
  return s;
}

}  // namespace llmtrain::launcher
