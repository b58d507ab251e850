#include "launcher/preflight.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "common/error.h"
#include "common/file_io.h"
#include "common/strings.h"
#include "kernels/backend_info.h"
#include "launcher/child_process.h"

namespace llmtrain::launcher {
namespace {

std::string address_text(const sockaddr* sa) {
  char buf[NI_MAXHOST] = {};
  socklen_t len = sa->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  if (getnameinfo(sa, len, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) != 0) return "";
  return buf;
}

std::set<std::string> local_addresses() {
  std::set<std::string> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a; a = a->ifa_next)
    if (a->ifa_addr && (a->ifa_addr->sa_family == AF_INET || a->ifa_addr->sa_family == AF_INET6))
      out.insert(address_text(a->ifa_addr));
  freeifaddrs(list);
  return out;
}

void check_program(const std::string& program, const std::string& what, const std::string& hint) {
  if (find_program(program).empty())
    throw environment_error(
        fmt::format("{} ({}) was not found{}", program, what, program.find('/') == std::string::npos ? " on PATH" : ""),
        hint);
}

// Local mpirun: this host's devices are the ranks' devices, checked before they start (each rank
// checks again, on its own node, when it takes its device: kernels/device_select.h).
void check_devices(const Recipe& r, const LaunchPlan& plan) {
  if (r.train.device != DeviceKind::cuda) return;
  kernels::CudaInfo cuda = kernels::cuda_info();
  const int have = static_cast<int>(cuda.devices.size());
  if (have >= plan.ranks_per_node || (have > 0 && r.launch.share_devices)) return;
  std::string why = cuda.unavailable_reason.empty() ? "" : fmt::format(" ({})", cuda.unavailable_reason);
  throw environment_error(
      fmt::format("train.device is cuda and {} rank(s) run on this host (launch.procs_per_node {}), but {} CUDA "
                  "device(s) are visible{}",
                  plan.ranks_per_node, r.launch.procs_per_node, have, why),
      have == 0 ? (cuda.simulator ? "set LLMTRAIN_SIM_DEVICES to a whole number of simulated devices, or unset it"
                                  : "run on a machine with NVIDIA GPUs (`llmtrain env` lists what this one has), or "
                                    "use train.device: cpu")
                : fmt::format("each rank needs its own device: set launch.procs_per_node to {} or fewer, check "
                              "CUDA_VISIBLE_DEVICES, or let ranks share devices with launch.share_devices: true{}",
                              have, cuda.simulator ? " (the simulator shows LLMTRAIN_SIM_DEVICES devices)" : ""));
}

void check_slurm(const Recipe& r, const LaunchPlan& plan, const SlurmAllocation& a) {
  const std::string job = fmt::format("Slurm job {}", a.job_id);
  const std::string world = fmt::format("{} ranks (launch.nodes {} × launch.procs_per_node {})", plan.world_size,
                                        plan.nodes, plan.ranks_per_node);
  if (a.nodes > 0 && plan.nodes > a.nodes)
    throw Error(
        fmt::format("the recipe needs {} but {} has {} node(s) (SLURM_JOB_NUM_NODES={})", world, job, a.nodes, a.nodes),
        "allocate as many nodes as launch.nodes (`llmtrain sbatch RECIPE --nodes N` sets both), or lower "
        "launch.nodes");
  if (a.ntasks > 0 && a.ntasks < plan.world_size)
    throw Error(
        fmt::format("the recipe needs {} but {} has {} task(s) (SLURM_NTASKS={})", world, job, a.ntasks, a.ntasks),
        "allocate --ntasks-per-node equal to launch.procs_per_node (`llmtrain sbatch` does), or change "
        "launch.procs_per_node");
  if (r.train.device == DeviceKind::cuda && a.gpus_per_node > 0 && a.gpus_per_node < plan.ranks_per_node &&
      !r.launch.share_devices)
    throw Error(fmt::format("train.device is cuda with {} ranks per node, but {} has {} GPU(s) per node ({}): srun "
                            "would wait forever for a GPU per rank",
                            plan.ranks_per_node, job, a.gpus_per_node, a.gpus_source),
                "allocate a GPU per rank (--gpus-per-node equal to launch.procs_per_node; `llmtrain sbatch` does), "
                "lower launch.procs_per_node, or let ranks share devices with launch.share_devices: true");
  const int cpus = a.min_cpus_per_node();
  const int need = plan.ranks_per_node * plan.threads_per_rank;
  if (cpus > 0 && need > cpus)
    throw Error(fmt::format("{} ranks per node × {} CPUs per rank = {} CPUs, but {} has {} CPUs on its smallest node "
                            "(SLURM_JOB_CPUS_PER_NODE={}): srun would wait for them forever",
                            plan.ranks_per_node, plan.threads_per_rank, need, job, cpus,
                            std::getenv("SLURM_JOB_CPUS_PER_NODE") ? std::getenv("SLURM_JOB_CPUS_PER_NODE") : "?"),
                r.train.threads > 0 ? "lower train.threads, or allocate more CPUs per task (--cpus-per-task)"
                                    : "allocate more CPUs per node (--cpus-per-task, or --exclusive)");
}

void check_ssh(const Recipe& r, const LaunchPlan& plan, const PreflightOptions& opt) {
  const auto& ssh = r.launch.ssh;
  for (const auto& [key, path] : {std::pair{"launch.ssh.identity", ssh.identity}, {"launch.ssh.config", ssh.config}}) {
    if (path.empty()) continue;
    if (path.find_first_of(" \t") != std::string::npos)
      throw Error(fmt::format("{} '{}' contains a space, which Open MPI cannot pass to ssh (plm_rsh_agent is split at "
                              "spaces)",
                              key, path),
                  "move the file to a path without spaces");
    if (::access(path.c_str(), R_OK) != 0)
      throw Error(fmt::format("{} {}: cannot read it: {}", key, path, std::strerror(errno)),
                  "check the path (relative paths are relative to the current directory)");
  }
  std::vector<std::string> short_hosts;
  for (const auto& h : plan.hosts)
    if (h.slots > 0 && h.slots < plan.ranks_per_node)
      short_hosts.push_back(fmt::format("{}:{}: host {} has slots={}", r.launch.hostfile, h.line, h.host, h.slots));
  if (!short_hosts.empty())
    throw Error(fmt::format("launch.procs_per_node is {} (world {} = {} hosts × {}), but {}", plan.ranks_per_node,
                            plan.world_size, plan.hosts.size(), plan.ranks_per_node, join(short_hosts, "; ")),
                "give every host slots=N with N ≥ launch.procs_per_node, or lower launch.procs_per_node");

  std::vector<std::string> remote;
  std::vector<std::vector<std::string>> probes;
  for (const auto& h : plan.hosts) {
    if (is_local_host(h.host)) continue;
    std::vector<std::string> argv{"ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"};
    if (ssh.port != 22) argv.insert(argv.end(), {"-p", std::to_string(ssh.port)});
    if (!ssh.identity.empty()) argv.insert(argv.end(), {"-i", ssh.identity});
    if (!ssh.config.empty()) argv.insert(argv.end(), {"-F", ssh.config});
    argv.insert(argv.end(), {h.host, "true"});
    remote.push_back(h.host);
    probes.push_back(std::move(argv));
  }
  if (probes.empty()) return;
  check_program("ssh", "Open MPI starts its daemons on the other hosts with it",
                "install the ssh client (Debian: apt-get install openssh-client)");
  std::vector<CommandResult> results = run_commands(probes, opt.ssh_timeout_s);
  std::vector<std::string> failures;
  for (size_t i = 0; i < results.size(); ++i) {
    const CommandResult& res = results[i];
    if (res.status == 0) continue;
    std::string why = res.timed_out              ? fmt::format("no answer within {}s", opt.ssh_timeout_s)
                      : !res.start_error.empty() ? res.start_error
                                                 : fmt::format("ssh exited {}", res.status);
    std::string said = trim(res.output);
    failures.push_back(fmt::format("  {}: {}{}\n    command: {}", remote[i], why, said.empty() ? "" : ": " + said, [&] {
      std::string line;
      for (const auto& a : probes[i]) line += (line.empty() ? "" : " ") + shell_quote(a);
      return line;
    }()));
  }
  if (!failures.empty())
    throw environment_error(
        fmt::format("{} of {} host(s) in {} cannot be reached over ssh with the recipe's options:\n{}", failures.size(),
                    remote.size(), r.launch.hostfile, join(failures, "\n")),
        "the launcher needs key-based, non-interactive ssh to every host: check launch.ssh.port/identity/config, "
        "that the host's sshd runs and accepts the key, and that its host key is known (or StrictHostKeyChecking "
        "accept-new in the ssh config)");
}

}  // namespace

bool is_local_host(const std::string& host) {
  if (host == "localhost") return true;
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) == 0) {
    std::string full = name;
    if (host == full || host == full.substr(0, full.find('.'))) return true;
  }
  std::set<std::string> mine = local_addresses();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  bool local = false;
  for (addrinfo* a = found; a && !local; a = a->ai_next) local = mine.count(address_text(a->ai_addr)) > 0;
  freeaddrinfo(found);
  return local;
}

void check_writable_dir(const std::string& dir, const std::string& key) {
  namespace fs = std::filesystem;
  // The folder, or where it would be created: its nearest existing ancestor. Nothing is created
  // here — a run refused by a later check (no usable GPU, a held lock) leaves no folders behind.
  std::error_code ec;
  fs::path at = fs::absolute(dir, ec).lexically_normal();
  while (!fs::exists(at, ec) && at.has_parent_path() && at.parent_path() != at) at = at.parent_path();
  if (!fs::is_directory(at, ec))
    throw environment_error(
        fmt::format("{} {}: cannot create it: {}", key, dir, std::strerror(ENOTDIR)),
        fmt::format("choose a folder this user can write (--set {}=PATH): {} is not a folder", key, at.string()));
  const std::string probe_dir = at.string();
  // A new file of an unpredictable name, created exclusively: a link planted in a shared folder
  // cannot turn the probe into a write elsewhere, and only the file made here is removed.
  std::string probe;
  int fd = -1;
  try {
    fd = create_temp_file(probe_dir + "/.llmtrain-write-test", &probe);
  } catch (const Error& e) {
    throw environment_error(
        fmt::format("{} {}: cannot write in it: {}", key, dir, e.what()),
        fmt::format("choose a folder this user can write (--set {}=PATH), or fix its permissions", key));
  }
  const bool wrote = ::write(fd, "x", 1) == 1;
  const int err = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!wrote)
    throw environment_error(
        fmt::format("{} {}: cannot write in it: {}", key, dir, std::strerror(err)),
        fmt::format("choose a folder this user can write (--set {}=PATH), or fix its permissions", key));
}

std::string oversubscription_warning(int ranks, int threads, int cores, int others) {
  const int64_t ours = int64_t(ranks) * threads;
  const int64_t busy = ours + std::max(others, 0);
  if (busy <= cores) return "";
  const std::string besides =
      others > 0 ? fmt::format(" and {} other runnable thread(s) right now (/proc/loadavg)", others) : "";
  return fmt::format(
      "this host is oversubscribed: {} rank(s) × {} thread(s) = {} compute thread(s){} on {} usable core(s); steps "
      "will be slower and uneven (idle threads sleep after a short spin, GOMP_SPINCOUNT=1000, so they do not spin "
      "against the other work); {}",
      ranks, threads, ours, besides, cores,
      ours > cores ? "fewer ranks or --set train.threads=N with ranks × N ≤ the cores fits them"
                   : "on a shared machine --set train.threads=1 often holds up best (docs/benchmarks.md)");
}

void preflight_check(const Recipe& r, const LaunchPlan& plan, const PreflightOptions& opt) {
  if (plan.spawns()) {
    const std::string& program = plan.command.front();
    if (program == "srun")
      check_program("srun", "Slurm's launcher, needed inside an allocation",
                    "install Slurm's client tools (Debian: apt-get install slurm-client) or load your cluster's "
                    "Slurm module");
    else
      check_program(program, "Open MPI's launcher",
                    "install Open MPI (Debian: apt-get install openmpi-bin) or load your cluster's MPI module");
    if (!plan.rank_argv.empty())
      check_program(plan.rank_argv.front(), "the program every rank runs", "check the path of the rank program");
  }
  if (opt.check_devices && plan.mode == LaunchMode::local_mpirun) check_devices(r, plan);
  if (plan.mode == LaunchMode::slurm_srun) check_slurm(r, plan, slurm_allocation_from_env());
  if (plan.mode == LaunchMode::ssh_mpirun) check_ssh(r, plan, opt);
  // Last: these create the run's folders, which a job refused by the checks above must not leave behind.
  check_writable_dir(r.log.dir, "log.dir");
  check_writable_dir(r.checkpoint.dir, "checkpoint.dir");
}

}  // namespace llmtrain::launcher
