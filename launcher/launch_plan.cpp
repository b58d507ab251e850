#include "launcher/launch_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/host.h"

namespace llmtrain::launcher {

const char* to_string(LaunchMode mode) {
  switch (mode) {
    case LaunchMode::in_process:
      return "in-process (one rank)";
    case LaunchMode::as_rank:
      return "this process is a rank";
    case LaunchMode::local_mpirun:
      return "local mpirun";
    case LaunchMode::slurm_srun:
      return "Slurm srun --mpi=pmix";
    case LaunchMode::ssh_mpirun:
      return "mpirun over ssh";
  }
  return "?";
}

trainer::WorldInfo planned_world(const trainer::Recipe& r, const parallel::LaunchEnv& env) {
  if (env.launcher != parallel::Launcher::none) return {env.world_size, env.world_source()};
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

LaunchPlan plan_launch(const trainer::Recipe& r, const parallel::LaunchEnv& env,
                       const std::vector<std::string>& rank_argv) {
  LaunchPlan plan;
  plan.world_size = r.world_size();
  plan.ranks_per_node = r.launch.procs_per_node;
  int cores = usable_cores();
  plan.threads_per_rank = r.train.threads > 0 ? r.train.threads : std::max(1, cores / std::max(1, plan.ranks_per_node));

  if (env.is_rank()) {
    plan.mode = LaunchMode::as_rank;
    plan.ranks_per_node = env.local_size;
    plan.threads_per_rank = r.train.threads > 0 ? r.train.threads : std::max(1, cores / std::max(1, env.local_size));
    return plan;
  }
  if (plan.world_size == 1) {
    plan.mode = LaunchMode::in_process;
    return plan;
  }
  auto& cmd = plan.command;
  if (env.in_slurm_allocation()) {
    plan.mode = LaunchMode::slurm_srun;
    cmd = {"srun", "--mpi=pmix", fmt::format("--ntasks={}", plan.world_size),
           fmt::format("--ntasks-per-node={}", r.launch.procs_per_node), "--kill-on-bad-exit=1"};
  } else {
    plan.mode = r.launch.hostfile.empty() ? LaunchMode::local_mpirun : LaunchMode::ssh_mpirun;
    if (plan.mode == LaunchMode::local_mpirun && r.launch.nodes > 1) {
      plan.blocker =
          fmt::format("launch.nodes is {} but this is one host, outside any Slurm allocation", r.launch.nodes);
      plan.blocker_hint =
          "submit it with `llmtrain sbatch RECIPE --nodes N`, run it inside an allocation, or list the hosts in "
          "launch.hostfile";
    }
    cmd = {"mpirun", "-np", std::to_string(plan.world_size)};
    if (plan.mode == LaunchMode::ssh_mpirun) {
      cmd.insert(cmd.end(),
                 {"--hostfile", r.launch.hostfile, "--map-by", fmt::format("ppr:{}:node", r.launch.procs_per_node)});
      std::string agent = "ssh";
      if (r.launch.ssh.port != 22) agent += fmt::format(" -p {}", r.launch.ssh.port);
      if (!r.launch.ssh.identity.empty()) agent += " -i " + shell_quote(r.launch.ssh.identity);
      if (!r.launch.ssh.config.empty()) agent += " -F " + shell_quote(r.launch.ssh.config);
      cmd.insert(cmd.end(), {"--mca", "plm_rsh_agent", agent});
    }
    // Oversubscribed hosts (more ranks than cores) must not pin ranks to cores.
    if (plan.mode == LaunchMode::local_mpirun && plan.world_size > cores)
      cmd.insert(cmd.end(), {"--oversubscribe", "--bind-to", "none"});
    cmd.insert(cmd.end(), {"-x", fmt::format("OMP_NUM_THREADS={}", plan.threads_per_rank)});
  }
  cmd.insert(cmd.end(), rank_argv.begin(), rank_argv.end());
  return plan;
}

}  // namespace llmtrain::launcher
