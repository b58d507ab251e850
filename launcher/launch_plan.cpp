#include "launcher/launch_plan.h"

#include <fmt/format.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>

#include "common/enum_names.h"
#include "common/error.h"
#include "common/host.h"
#include "common/strings.h"
#include "parallel/comm/flight_recorder.h"
#include "parallel/progress.h"

extern char** environ;  // POSIX: the process's environment

namespace llmtrain::launcher {
namespace {

// Cross-memory attach, which Open MPI's shared-memory transport uses for large messages: a
// container's seccomp profile often forbids process_vm_readv, and then every large message fails.
bool cma_works() {
  char source[8] = "probe", target[8] = {};
  iovec local{target, sizeof target};
  iovec remote{source, sizeof source};
  return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == static_cast<ssize_t>(sizeof source);
}

// Options every mpirun launch shares: output tagged by rank (the supervisor parses it), the threads
// per rank, the restart count, the job, and the progress and flight-record settings (parallel/
// progress.h) exported to every rank, also on other hosts.
// The device settings of this environment (CUDA_VISIBLE_DEVICES, LLMTRAIN_SIM_DEVICES, NCCL_*) go
// to every rank too: mpirun copies its environment only to the ranks on its own host.
void add_mpirun_common(LaunchPlan& plan, const PlanInputs& in, std::vector<std::string>& cmd) {
  cmd.insert(cmd.end(), {"--tag-output", "-x", fmt::format("OMP_NUM_THREADS={}", plan.threads_per_rank), "-x",
                         kRestartCountEnv, "-x", kJobEnv, "-x", parallel::kProgressEnv, "-x", parallel::kFlightDirEnv});
  for (const std::string& name : in.forwarded_env) cmd.insert(cmd.end(), {"-x", name});
  if (!in.forwarded_env.empty())
    plan.notes.push_back(fmt::format("passed on to every rank (-x): {}", join(in.forwarded_env, " ")));
}

// train.device cuda under srun: one GPU per task, bound to it (the rank sees it as device 0), when
// the allocation holds GPUs Slurm knows of and each rank may have its own.
void add_srun_gpus(LaunchPlan& plan, const Recipe& r, const SlurmAllocation& a, std::vector<std::string>& cmd) {
  if (r.train.device != DeviceKind::cuda) return;
  if (a.gpus_per_node == 0) {
    plan.notes.push_back(
        "the allocation holds no GPUs Slurm manages (SLURM_GPUS_ON_NODE, SLURM_JOB_GPUS, SLURM_GPUS_PER_NODE "
        "unset): srun asks for none, each rank takes local rank mod the CUDA devices it sees");
    return;
  }
  if (r.launch.share_devices) {
    plan.notes.push_back(fmt::format(
        "launch.share_devices: srun asks for no GPU per task; the {} rank(s) of a node share its {} GPU(s) ({}), "
        "each taking local rank mod {}",
        plan.ranks_per_node, a.gpus_per_node, a.gpus_source, a.gpus_per_node));
    return;
  }
  cmd.insert(cmd.end(), {"--gpus-per-task=1", "--gpu-bind=per_task:1"});
  plan.notes.push_back(fmt::format(
      "train.device cuda: one of the allocation's {} GPU(s) per node ({}) per rank, bound to it (it is the rank's "
      "device 0)",
      a.gpus_per_node, a.gpus_source));
}

void add_mpirun_env(LaunchPlan& plan, const PlanInputs& in) {
  if (in.root) {
    plan.env.push_back({"OMPI_ALLOW_RUN_AS_ROOT", "1"});
    plan.env.push_back({"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"});
    plan.notes.push_back("running as root: OMPI_ALLOW_RUN_AS_ROOT=1 (Open MPI refuses root otherwise)");
  }
  if (!in.cma_available) {
    plan.env.push_back({"OMPI_MCA_btl_vader_single_copy_mechanism", "none"});
    plan.notes.push_back(
        "process_vm_readv is not permitted here (a container's seccomp profile?): Open MPI's shared-memory "
        "transport copies through a buffer instead (btl_vader_single_copy_mechanism=none)");
  }
}

}  // namespace

const char* to_string(LaunchMode mode) {
  static constexpr EnumName<LaunchMode> kNames[] = {{"in-process (one rank)", LaunchMode::in_process},
                                                    {"this process is a rank", LaunchMode::as_rank},
                                                    {"local mpirun", LaunchMode::local_mpirun},
                                                    {"Slurm srun --mpi=pmix", LaunchMode::slurm_srun},
                                                    {"mpirun over ssh", LaunchMode::ssh_mpirun}};
  return enum_name(kNames, mode);
}

PlanInputs plan_inputs(const parallel::LaunchEnv& env, bool rank_program) {
  PlanInputs in;
  in.env = env;
  if (env.in_slurm_allocation()) in.slurm = slurm_allocation_from_env();
  in.cores = usable_cores();
  in.root = geteuid() == 0;
  in.cma_available = cma_works();
  in.rank_program = rank_program;
  in.forwarded_env = forwarded_env_names(environ);
  return in;
}

std::vector<std::string> forwarded_env_names(const char* const* entries) {
  std::vector<std::string> names;
  for (const char* const* e = entries; e && *e; ++e) {
    const std::string_view entry = *e;
    const std::string_view name = entry.substr(0, entry.find('='));
    const bool wanted = name == "CUDA_VISIBLE_DEVICES" || name == "LLMTRAIN_SIM_DEVICES" || name.starts_with("NCCL_");
    const bool word = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0])) &&
                      std::all_of(name.begin(), name.end(),
                                  [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
    if (wanted && word && std::find(names.begin(), names.end(), name) == names.end()) names.emplace_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

WorldInfo planned_world(const Recipe& r, const parallel::LaunchEnv& env) {
  if (env.launcher != parallel::Launcher::none) return {env.world_size, env.world_source()};
  // (With launch.nodes > 1 as well, recipe_check reports the conflict; the file is not read.)
  if (!r.launch.hostfile.empty() && !env.in_slurm_allocation() && r.launch.nodes == 1) {
    Hostfile hf = hostfile_read(r.launch.hostfile);
    int hosts = static_cast<int>(hf.hosts.size());
    return {hosts * r.launch.procs_per_node,
            fmt::format("{} hosts in launch.hostfile × launch.procs_per_node {}", hosts, r.launch.procs_per_node)};
  }
  return {r.launch.nodes * r.launch.procs_per_node,
          fmt::format("launch.nodes {} × launch.procs_per_node {}", r.launch.nodes, r.launch.procs_per_node)};
}

std::string shell_quote(const std::string& arg) {
  bool plain = !arg.empty() && std::all_of(arg.begin(), arg.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) ||
           std::string_view("-_./=:,+@%").find(c) != std::string_view::npos;
  });
  if (plain) return arg;
  std::string out = "'";
  for (char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string LaunchPlan::command_line() const {
  std::string out;
  for (const auto& a : command) out += (out.empty() ? "" : " ") + shell_quote(a);
  return out;
}

std::string LaunchPlan::env_line() const {
  std::string out;
  for (const auto& [k, v] : env) out += (out.empty() ? "" : " ") + k + "=" + shell_quote(v);
  return out;
}

std::vector<std::string> LaunchPlan::command_with(const std::vector<std::string>& extra_rank_args) const {
  std::vector<std::string> out = command;
  out.insert(out.end(), extra_rank_args.begin(), extra_rank_args.end());
  return out;
}

LaunchPlan plan_launch(const Recipe& r, const parallel::LaunchEnv& env, const std::vector<std::string>& rank_argv) {
  return plan_launch(r, plan_inputs(env), rank_argv);
}

LaunchPlan plan_launch(const Recipe& r, const PlanInputs& in, const std::vector<std::string>& rank_argv) {
  LaunchPlan plan;
  const parallel::LaunchEnv& env = in.env;
  plan.world_size = r.world_size();
  plan.ranks_per_node = r.launch.procs_per_node;
  plan.nodes = r.launch.nodes;
  plan.rank_argv = rank_argv;
  plan.threads_per_rank = threads_per_rank(r, in.cores, plan.ranks_per_node);

  if (env.is_rank()) {
    plan.mode = LaunchMode::as_rank;
    plan.ranks_per_node = env.local_size;
    plan.threads_per_rank = threads_per_rank(r, in.cores, env.local_size);
    if (in.rank_program) {
      plan.blocker = "this process is already a rank (" + env.world_source() + "), so it cannot start ranks of its own";
      plan.blocker_hint = "run `llmtrain run RECIPE -- PROGRAM` outside mpirun/srun; it starts the ranks itself";
    }
    return plan;
  }
  // One rank trains in this process, unless something else must run as the rank or the launcher
  // must be able to restart it (a process cannot restart itself after it crashed).
  if (plan.world_size == 1 && !in.rank_program && r.launch.max_restarts == 0 && !env.in_slurm_allocation()) {
    plan.mode = LaunchMode::in_process;
    plan.rank_argv.clear();
    return plan;
  }
  auto& cmd = plan.command;
  if (env.in_slurm_allocation()) {
    plan.mode = LaunchMode::slurm_srun;
    const SlurmAllocation& a = in.slurm;
    int threads = r.train.threads > 0         ? r.train.threads
                  : a.cpus_per_task > 0       ? a.cpus_per_task
                  : a.min_cpus_per_node() > 0 ? std::max(1, a.min_cpus_per_node() / plan.ranks_per_node)
                                              : plan.threads_per_rank;
    plan.threads_per_rank = threads;
    cmd = {"srun",
           "--mpi=pmix",
           fmt::format("--nodes={}", plan.nodes),
           fmt::format("--ntasks={}", plan.world_size),
           fmt::format("--ntasks-per-node={}", plan.ranks_per_node),
           fmt::format("--cpus-per-task={}", threads),
           "--kill-on-bad-exit=1",
           "--label"};
    plan.env.push_back({"OMP_NUM_THREADS", std::to_string(threads)});
    plan.notes.push_back(fmt::format("inside Slurm job {}: ranks start through srun --mpi=pmix on the allocation",
                                     a.job_id.empty() ? env.slurm_job_id : a.job_id));
    add_srun_gpus(plan, r, a, cmd);
    if (!r.launch.hostfile.empty()) {
      plan.blocker = fmt::format(
          "launch.hostfile is set ({}), but this runs inside Slurm job {}, whose nodes are "
          "given by Slurm",
          r.launch.hostfile, env.slurm_job_id);
      plan.blocker_hint = "remove launch.hostfile inside Slurm (--set launch.hostfile=null)";
    }
  } else if (!r.launch.hostfile.empty()) {
    plan.mode = LaunchMode::ssh_mpirun;
    Hostfile hf = hostfile_read(r.launch.hostfile);
    plan.hosts = hf.hosts;
    plan.nodes = static_cast<int>(hf.hosts.size());
    // Open MPI splits plm_rsh_agent at spaces (no shell quoting), so every piece must be one word.
    std::string agent = "ssh -o BatchMode=yes";
    if (r.launch.ssh.port != 22) agent += fmt::format(" -p {}", r.launch.ssh.port);
    if (!r.launch.ssh.identity.empty()) agent += " -i " + r.launch.ssh.identity;
    if (!r.launch.ssh.config.empty()) agent += " -F " + r.launch.ssh.config;
    cmd = {"mpirun",
           "-np",
           std::to_string(plan.world_size),
           "--hostfile",
           r.launch.hostfile,
           "--map-by",
           fmt::format("ppr:{}:node", plan.ranks_per_node),
           "--bind-to",
           "none",
           "--mca",
           "plm_rsh_agent",
           agent};
    add_mpirun_common(plan, in, cmd);
    add_mpirun_env(plan, in);
    plan.notes.push_back(fmt::format(
        "{} hosts × {} ranks over ssh; threads per rank from this host's {} cores{}", plan.nodes, plan.ranks_per_node,
        in.cores, r.train.threads > 0 ? " (train.threads)" : " (set train.threads if the hosts differ)"));
  } else {
    plan.mode = LaunchMode::local_mpirun;
    if (r.launch.nodes > 1) {
      plan.blocker =
          fmt::format("launch.nodes is {} but this is one host, outside any Slurm allocation", r.launch.nodes);
      plan.blocker_hint =
          "submit it with `llmtrain sbatch RECIPE --nodes N`, run it inside an allocation, or list the hosts in "
          "launch.hostfile";
    }
    cmd = {"mpirun", "-np", std::to_string(plan.world_size)};
    if (plan.world_size > in.cores) {
      // More ranks than cores: Open MPI refuses without --oversubscribe, and pinned ranks would
      // share cores while others idle.
      cmd.insert(cmd.end(), {"--oversubscribe", "--bind-to", "none"});
      plan.notes.push_back(fmt::format("{} ranks on {} cores: oversubscribed, binding off", plan.world_size, in.cores));
    } else if (plan.threads_per_rank > 1) {
      // Open MPI binds each rank to one core by default (np <= 2), which would confine a rank's
      // threads to that core.
      cmd.insert(cmd.end(), {"--bind-to", "none"});
      plan.notes.push_back(
          fmt::format("{} threads per rank: binding off so a rank's threads may use its cores", plan.threads_per_rank));
    }
    add_mpirun_common(plan, in, cmd);
    add_mpirun_env(plan, in);
    if (plan.world_size == 1)
      plan.notes.push_back(in.rank_program ? "one rank of the given program, under mpirun"
                                           : fmt::format("one rank under mpirun so that the launcher can restart it "
                                                         "(launch.max_restarts {})",
                                                         r.launch.max_restarts));
  }
  cmd.insert(cmd.end(), plan.rank_argv.begin(), plan.rank_argv.end());
  return plan;
}

}  // namespace llmtrain::launcher
