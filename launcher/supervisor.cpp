#include "launcher/supervisor.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "common/checkpoint_dir.h"
#include "common/enum_names.h"
#include "common/error.h"
#include "common/host.h"
#include "common/signals.h"
#include "common/strings.h"
#include "launcher/child_process.h"
#include "launcher/rank_output.h"
#include "launcher/restart_policy.h"
#include "launcher/stop_relay.h"
#include "parallel/comm/flight_recorder.h"
#include "parallel/progress.h"

namespace llmtrain::launcher {
namespace {

constexpr int kTickMs = 200;
constexpr double kDrainSeconds = 2.0;       // output still in the pipes after the launcher exited
constexpr double kHardStopSeconds = 10.0;   // from a hard stop to SIGKILL of the whole group
constexpr double kFlightDumpSeconds = 5.0;  // for the ranks to write their flight records on a hang

// --- signals: the handler only writes the signal number into a pipe the loop polls ---------

int g_signal_pipe[2] = {-1, -1};

void on_stop_signal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  const int saved = errno;
  ssize_t ignored = ::write(g_signal_pipe[1], &b, 1);
  (void)ignored;
  errno = saved;
}

class SignalCapture {
 public:
  SignalCapture() {
    LT_CHECK(g_signal_pipe[0] < 0, "two supervisors in one process");
    if (pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
      throw environment_error(fmt::format("cannot create a pipe: {}", std::strerror(errno)));
    for (int i = 0; i < 3; ++i) previous_[i] = install_signal_handler(kSignals[i], on_stop_signal);
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ign, &previous_pipe_);  // a closed console must not kill the supervisor
  }
  ~SignalCapture() {
    for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &previous_[i], nullptr);
    sigaction(SIGPIPE, &previous_pipe_, nullptr);
    for (int& fd : g_signal_pipe) ::close(fd), fd = -1;
  }
  int fd() const { return g_signal_pipe[0]; }
  // The next signal that arrived, or 0.
  int take() {
    unsigned char b = 0;
    return ::read(g_signal_pipe[0], &b, 1) == 1 ? b : 0;
  }

 private:
  static constexpr int kSignals[3] = {SIGTERM, SIGINT, SIGHUP};
  struct sigaction previous_[3]{};
  struct sigaction previous_pipe_ {};
};

const char* signal_name(int sig) {
  static constexpr EnumName<int> kNames[] = {{"SIGTERM", SIGTERM}, {"SIGINT", SIGINT}, {"SIGHUP", SIGHUP}};
  return enum_name(kNames, sig, "a signal");
}

// The processes whose parent is `parent` (the ranks mpirun started on this host).
std::vector<pid_t> child_pids(pid_t parent) {
  std::vector<pid_t> out;
  DIR* proc = opendir("/proc");
  if (!proc) return out;
  while (dirent* e = readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    std::ifstream stat(fmt::format("/proc/{}/stat", pid));
    std::string text;
    if (!std::getline(stat, text)) continue;
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses; it ends at the last ')'.
    auto close = text.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(text.substr(close + 1));
    std::string state;
    long ppid = 0;
    if (rest >> state >> ppid && ppid == parent) out.push_back(static_cast<pid_t>(pid));
  }
  closedir(proc);
  return out;
}

// The command name of process `pid` ("?" when it is gone).
std::string process_name(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/comm", pid));
  std::string name;
  std::getline(in, name);
  return name.empty() ? "?" : name;
}

// The Slurm job's state as squeue reports it ("RUNNING", "CANCELLED", ...), "" when unknown.
std::string slurm_job_state(const std::string& job_id) {
  CommandResult r = run_command({"squeue", "-h", "-j", job_id, "-o", "%T"}, 5.0);
  if (r.status != 0) return "";
  return trim(r.output);
}

// How often the ranks report progress: a quarter of the hang timeout, between 0.25 s and 30 s.
double progress_interval_s(const SupervisorOptions& o) {
  return o.hang_timeout_s > 0 ? std::clamp(o.hang_timeout_s / 4, 0.25, 30.0) : 30.0;
}

// Field 22 of /proc/PID/stat: when the process started, in clock ticks since boot ("" when it is
// gone). With the boot's id it tells a live owner from a later process that took its pid.
std::string process_start_ticks(long pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string text;
  if (!std::getline(in, text)) return "";
  const auto close = text.rfind(')');  // comm may hold spaces and parentheses
  if (close == std::string::npos) return "";
  std::istringstream rest(text.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
  }
  return field;
}

std::string boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return trim(id);
}

// A scratch directory's owner, written into it: "host boot-id pid start-ticks". A killed launcher
// (SIGKILL, a timeout's kill) cannot remove its scratch, so the next launch on the host removes
// every llmtrain-launch.* directory of this user whose owner is provably dead: same host and boot,
// and no process with that pid, or one that started at another time (the pid reused). Anything
// else — another host's (a shared TMPDIR), a record that cannot be read — is left alone.
constexpr const char* kScratchOwner = "owner";

std::string scratch_owner_line() {
  return fmt::format("{} {} {} {}\n", host_info().hostname, boot_id(), long(getpid()), process_start_ticks(getpid()));
}

bool scratch_owner_dead(const std::filesystem::path& dir) {
  std::ifstream in(dir / kScratchOwner);
  std::string host, boot, start;
  long pid = 0;
  if (!(in >> host >> boot >> pid >> start) || pid <= 0) return false;
  if (host != host_info().hostname || boot != boot_id()) return false;
  if (::kill(pid_t(pid), 0) == 0 || errno == EPERM) return process_start_ticks(pid) != start;
  return errno == ESRCH;
}

void remove_dead_scratch(const std::string& base) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::directory_iterator it(base, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("llmtrain-launch.", 0) != 0) continue;
    struct stat st {};
    // A real directory of ours (never through a link), whose owner is provably dead.
    if (::lstat(it->path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid()) continue;
    if (!scratch_owner_dead(it->path())) continue;
    std::error_code rm;
    fs::remove_all(it->path(), rm);
  }
}

std::string make_scratch_dir() {
  const char* tmpdir = std::getenv("TMPDIR");
  for (const char* base : {"/dev/shm", tmpdir, "/tmp"}) {
    if (!base || !*base) continue;
    remove_dead_scratch(base);
    std::string templ = std::string(base) + "/llmtrain-launch.XXXXXX";
    if (!mkdtemp(templ.data())) continue;
    std::ofstream(std::filesystem::path(templ) / kScratchOwner) << scratch_owner_line();
    return templ;
  }
  return "";
}

class Supervisor {
 public:
  Supervisor(const LaunchPlan& plan, const SupervisorOptions& options, RankOutput& out)
      : plan_(plan), opt_(options), out_(out) {}

  bool stop_requested() const { return stop_signal_ != 0; }
  // The last attempt was ended because it made no progress (launch.hang_timeout).
  bool hung() const { return hang_ != HangState::none; }
  int stop_signal() const { return stop_signal_; }
  bool hard_stopped() const { return hard_stop_reason_ != HardStop::none; }
  bool hard_stop_by_user() const { return hard_stop_reason_ == HardStop::user; }

  // Runs one attempt to its end; returns its folded exit status.
  int run_attempt(const std::vector<std::string>& command, const EnvList& env) {
    ChildSpec spec;
    spec.argv = command;
    spec.env = env;
    spec.parent_death_signal = SIGTERM;  // a supervisor killed by SIGKILL must not leave the job behind
    Child child = Child::spawn(spec);
    signalled_.clear();
    progress_.clear();
    attempt_start_ = last_change_ = monotonic_seconds();
    hang_ = HangState::none;
    hard_stop_reason_ = HardStop::none;
    out_.set_progress_sink([this](int rank, std::string_view report) { on_progress(rank, report); });
    double drain_until = 0;
    int status = 0;
    while (true) {
      pollfd fds[3] = {{signals_.fd(), POLLIN, 0}, {child.stdout_fd(), POLLIN, 0}, {child.stderr_fd(), POLLIN, 0}};
      int ready = ::poll(fds, 3, kTickMs);
      if (ready > 0) {
        if (fds[0].revents & POLLIN)
          while (int sig = signals_.take()) on_signal(sig, child);
        for (int i = 1; i < 3; ++i) {
          if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
          char buf[65536];
          ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
          if (n > 0)
            out_.feed(i == 2, std::string_view(buf, static_cast<size_t>(n)));
          else if (n == 0 || errno != EINTR)
            i == 1 ? child.close_stdout() : child.close_stderr();
        }
      }
      const double now = monotonic_seconds();
      if (child.exited()) {
        // Output can trail the launcher's exit, or be held open by a straggling grandchild.
        if ((child.stdout_fd() < 0 && child.stderr_fd() < 0) || now > drain_until) break;
        continue;
      }
      if (child.poll_exit(status)) {
        drain_until = now + kDrainSeconds;
        continue;
      }
      tick(child, now);
    }
    out_.flush();
    kill_leftovers();
    return child.status();
  }

  // Processes of the attempt still alive after its launcher ended: a rank's helper that ignored
  // mpirun's signals, or ranks whose launcher died. The supervisor is their subreaper (supervise()),
  // so they are its children now rather than init's; they are killed, with their own children,
  // before the next attempt or the exit, so that nothing of a failed attempt keeps writing
  // checkpoints, holding ports or using memory.
  void kill_leftovers() {
    std::map<pid_t, std::string> killed;
    const double until = monotonic_seconds() + kHardStopSeconds;
    while (monotonic_seconds() < until) {
      while (::waitpid(-1, nullptr, WNOHANG) > 0) {  // zombies: exited, only unreaped
      }
      const std::vector<pid_t> alive = child_pids(::getpid());
      if (alive.empty()) break;
      for (pid_t pid : alive) {
        std::string name = process_name(pid);
        if (::kill(pid, SIGKILL) == 0) killed.emplace(pid, std::move(name));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!killed.empty()) {
      std::vector<std::string> names;
      for (const auto& [pid, name] : killed) names.push_back(fmt::format("{} ({})", pid, name));
      out_.launcher_message(
          fmt::format("killed {} process(es) the attempt left behind: {}", killed.size(), join(names, ", ")));
    }
  }

  // Waits `seconds` unless a stop signal comes first; false when one did.
  bool back_off(double seconds) {
    const double until = monotonic_seconds() + seconds;
    while (true) {
      double left = until - monotonic_seconds();
      if (left <= 0) return true;
      pollfd fd{signals_.fd(), POLLIN, 0};
      if (::poll(&fd, 1, static_cast<int>(left * 1000) + 1) > 0) {
        if (int sig = signals_.take()) {
          stop_signal_ = sig;
          out_.launcher_message(fmt::format("{} received while waiting to restart: not restarting", signal_name(sig)));
          return false;
        }
      }
    }
  }

 private:
  enum class HardStop { none, user, grace_expired, hang };
  enum class HangState { none, dumping, killed };

  // What one rank last reported (parallel/progress.h).
  struct RankProgress {
    std::string step, phase, beat, op, flight;
    double changed_at = 0;  // when step, phase or beat last changed
    double seen_at = 0;     // when it last reported
  };

  // "step=12 phase=train beat=96 flight=/path op=all_reduce #3 on group 'dp' (...) for 1.2s"
  void on_progress(int rank, std::string_view report) {
    auto field = [&](std::string_view key, bool to_end) -> std::string {
      const size_t at = report.find(key);
      if (at == std::string_view::npos) return "";
      std::string_view v = report.substr(at + key.size());
      if (!to_end) v = v.substr(0, v.find(' '));
      return std::string(v);
    };
    RankProgress& p = progress_[rank];
    std::string step = field("step=", false), phase = field("phase=", false), beat = field("beat=", false);
    const double now = monotonic_seconds();
    if (step != p.step || phase != p.phase || beat != p.beat) {
      p.changed_at = now;
      last_change_ = std::max(last_change_, now);
    }
    p.seen_at = now;
    p.step = std::move(step);
    p.phase = std::move(phase);
    p.beat = std::move(beat);
    p.op = field(" op=", true);
    if (std::string flight = field("flight=", false); !flight.empty()) p.flight = std::move(flight);
  }

  // A rank whose reports stopped (a stopped or dead process): two report intervals and a second.
  bool silent(const RankProgress& p, double now) const { return now - p.seen_at > 2 * progress_interval_s(opt_) + 1; }

  // The hang report: which ranks are behind — those gone silent (stopped, or dead without the
  // launcher noticing), else those at the lowest step that are not inside a collective the others
  // wait in — and what every rank was last seen doing.
  std::string describe_hang(double now) const {
    if (progress_.empty())
      return fmt::format("no rank has reported since the attempt started {} ago (stuck starting up)",
                         format_duration(now - attempt_start_));
    auto silent = [&](const RankProgress& p) { return this->silent(p, now); };
    int64_t lowest = INT64_MAX;
    // (Steps as the ranks reported them: a malformed one counts as 0, never as undefined behaviour.)
    auto step_of = [](const RankProgress& p) { return parse_int64(p.step).value_or(0); };
    for (const auto& [rank, p] : progress_) lowest = std::min<int64_t>(lowest, step_of(p));
    std::vector<std::string> behind, lines;
    for (const auto& [rank, p] : progress_) {
      if (silent(p)) behind.push_back(std::to_string(rank));
      const std::string doing =
          fmt::format("step {}, {}{}", p.step, p.phase, p.op.empty() ? ", not in a collective" : ", in " + p.op);
      lines.push_back(silent(p) ? fmt::format("rank {}: silent for {} (stopped or gone); last report: {}", rank,
                                              format_duration(now - p.seen_at), doing)
                                : fmt::format("rank {}: {}", rank, doing));
    }
    for (int pass = 0; pass < 2 && behind.empty(); ++pass)
      for (const auto& [rank, p] : progress_)
        if (step_of(p) == lowest && (pass == 1 || p.op.empty())) behind.push_back(std::to_string(rank));
    std::string missing;
    if (plan_.world_size > 0 && int(progress_.size()) < plan_.world_size) {
      std::vector<std::string> never;
      for (int r = 0; r < plan_.world_size; ++r)
        if (!progress_.count(r)) never.push_back(std::to_string(r));
      missing = fmt::format("; rank(s) {} never reported", join(never, ", "));
    }
    return fmt::format("rank(s) {} behind{}\n  {}", join(behind, ", "), missing, join(lines, "\n  "));
  }

  // No progress for hang_timeout_s (more while a rank saves or loads): report, collect the
  // flight records, then end the attempt.
  void watch_progress(Child& child, double now) {
    if (opt_.hang_timeout_s <= 0) return;
    if (hang_ == HangState::none) {
      // Start-up (launching the ranks and their bootstrap, before any reports; then each rank's
      // reading of data and checkpoint) and saves take the checkpoint bound: a slow start is not a
      // hang, however short hang_timeout is. Once one rank reports, a silent one counts as stuck.
      double bound = opt_.hang_timeout_s;
      if (progress_.empty()) bound = std::max(bound, opt_.checkpoint_timeout_s);
      // (A silent rank's last phase is stale: it does not extend the bound.)
      for (const auto& [rank, p] : progress_)
        if ((p.phase == "save" || p.phase == "load" || p.phase == "start") && !silent(p, now))
          bound = std::max(bound, opt_.checkpoint_timeout_s);
      if (now - last_change_ <= bound) return;
      out_.launcher_message(fmt::format("no progress for {} (launch.hang_timeout {}): {}",
                                        format_duration(now - last_change_), format_duration(bound),
                                        describe_hang(now)));
      hang_ = HangState::dumping;
      hang_deadline_ = now + kFlightDumpSeconds;
      // Each rank writes its flight record from its reporter thread (mpirun and srun forward
      // SIGUSR2 to every rank; local ranks get it straight).
      if (plan_.mode == LaunchMode::local_mpirun)
        for (pid_t pid : child_pids(child.pid())) ::kill(pid, SIGUSR2);
      else
        child.signal(SIGUSR2);
      return;
    }
    if (hang_ == HangState::dumping) {
      int dumped = 0;
      for (const auto& [rank, p] : progress_) dumped += p.flight.empty() ? 0 : 1;
      if (dumped < plan_.world_size && now < hang_deadline_) return;
      if (dumped > 0)
        out_.launcher_message(fmt::format(
            "flight records of {} rank(s) (their last communication operations): {}/flight/", dumped, opt_.log_dir));
      out_.launcher_message("ending the hung job");
      hang_ = HangState::killed;
      hard_stop(child, HardStop::hang);
    }
  }

  void on_signal(int sig, Child& child) {
    if (!stop_requested()) {
      stop_signal_ = sig;
      stop_deadline_ = monotonic_seconds() + opt_.stop_grace_s;
      out_.set_stopping(true);  // the ranks' exit 75 is the plan: mpirun's banners about it are noise
      forward_stop(sig, child);
      return;
    }
    if (sig == SIGINT && !hard_stopped()) {
      out_.launcher_message("second SIGINT: killing the job now, without waiting for a checkpoint");
      hard_stop(child, HardStop::user);
      return;
    }
    out_.launcher_message(
        fmt::format("{} received again: already stopping (Ctrl-C twice kills the job at once)", signal_name(sig)));
  }

  void forward_stop(int sig, Child& child) {
    const std::string grace = format_duration(opt_.stop_grace_s);
    switch (plan_.mode) {
      case LaunchMode::local_mpirun: {
        int n = signal_local_ranks(child);
        out_.launcher_message(
            fmt::format("{} received: sent SIGTERM to the {} rank process(es); each writes a "
                        "checkpoint and exits 75 (they have {} before they are killed)",
                        signal_name(sig), n, grace));
        break;
      }
      case LaunchMode::slurm_srun: {
        if (sig != SIGINT) {
          const char* job = std::getenv("SLURM_JOB_ID");
          std::string state = job ? slurm_job_state(job) : "";
          if (state != "RUNNING") {
            stop_forwarded_ = false;
            out_.launcher_message(fmt::format(
                "{} received while Slurm job {} is {}: Slurm signals the ranks itself, so the launcher does not "
                "(a second SIGTERM would make them exit without a checkpoint); waiting up to {} for them to "
                "checkpoint and exit",
                signal_name(sig), job ? job : "?", state.empty() ? "in an unknown state" : state, grace));
            return;
          }
        }
        [[fallthrough]];
      }
      case LaunchMode::ssh_mpirun:
        // srun and mpirun forward the relay signal to every rank, on every host.
        child.signal(kStopRelaySignal);
        out_.launcher_message(
            fmt::format("{} received: asked every rank, through {}, to write a checkpoint and "
                        "exit 75 (they have {} before they are killed)",
                        signal_name(sig), plan_.mode == LaunchMode::slurm_srun ? "srun" : "mpirun", grace));
        break;
      default:
        LT_CHECK(false, "supervising a plan that spawns nothing");
    }
    stop_forwarded_ = true;
  }

  // SIGTERM to every rank mpirun started on this host that has not had one yet.
  int signal_local_ranks(const Child& child) {
    int n = 0;
    for (pid_t pid : child_pids(child.pid())) {
      if (!signalled_.insert(pid).second) continue;
      if (::kill(pid, SIGTERM) == 0) ++n;
    }
    return n;
  }

  void hard_stop(Child& child, HardStop reason) {
    hard_stop_reason_ = reason;
    kill_deadline_ = monotonic_seconds() + kHardStopSeconds;
    if (plan_.mode == LaunchMode::local_mpirun)
      for (pid_t pid : child_pids(child.pid())) ::kill(pid, SIGKILL);
    // mpirun kills its ranks on every host; srun SIGKILLs its step.
    child.signal(SIGTERM);
  }

  void tick(Child& child, double now) {
    if (!stop_requested() && !hard_stopped()) {
      watch_progress(child, now);
      return;
    }
    if (hard_stopped()) {
      if (now > kill_deadline_) {
        out_.launcher_message(fmt::format("{} did not end {}s after SIGTERM: killing its process group",
                                          plan_.command.front(), kHardStopSeconds));
        child.signal(SIGKILL, true);
        kill_deadline_ = now + 3600;
      }
      return;
    }
    // Ranks mpirun started after the stop request get theirs too.
    if (plan_.mode == LaunchMode::local_mpirun && stop_forwarded_) signal_local_ranks(child);
    if (now > stop_deadline_) {
      out_.launcher_message(
          fmt::format("the ranks did not exit within {} of the stop request: killing the job "
                      "(no checkpoint for the current step)",
                      format_duration(opt_.stop_grace_s)));
      hard_stop(child, HardStop::grace_expired);
    }
  }

  const LaunchPlan& plan_;
  const SupervisorOptions& opt_;
  RankOutput& out_;
  SignalCapture signals_;
  int stop_signal_ = 0;
  bool stop_forwarded_ = false;
  double stop_deadline_ = 0;
  HardStop hard_stop_reason_ = HardStop::none;
  double kill_deadline_ = 0;
  std::set<pid_t> signalled_;
  std::map<int, RankProgress> progress_;
  double attempt_start_ = 0, last_change_ = 0;
  HangState hang_ = HangState::none;
  double hang_deadline_ = 0;
};

}  // namespace

SupervisorOptions supervisor_options(const Recipe& r) {
  SupervisorOptions o;
  o.log_dir = r.log.dir;
  o.checkpoint_dir = r.checkpoint.dir;
  o.max_restarts = r.launch.max_restarts;
  o.hang_timeout_s = r.launch.hang_timeout_s;
  o.checkpoint_timeout_s = r.checkpoint.timeout_s;
  if (const char* count = std::getenv("SLURM_RESTART_COUNT"))
    o.previous_restarts = int(std::clamp<int64_t>(parse_int64(count).value_or(0), 0, 1 << 20));
  return o;
}

int supervise(const LaunchPlan& plan, const SupervisorOptions& opt) {
  LT_CHECK(plan.spawns() && !plan.command.empty(), "supervise() needs a plan that starts ranks");
  // Orphans of the job (processes whose parent died) become this process's children instead of
  // init's, so that an attempt's leftovers can be found and ended (Supervisor::kill_leftovers).
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  const std::string program = plan.command.front();
  if (find_program(program).empty())
    throw environment_error(fmt::format("{} was not found on PATH", program),
                            program == "srun" ? "install Slurm's client tools (Debian: apt-get install slurm-client)"
                                              : "install Open MPI (Debian: apt-get install openmpi-bin)");
  const std::string logs = opt.log_dir.empty() ? "" : opt.log_dir + "/logs";
  RankOutput out(logs, plan.mode == LaunchMode::slurm_srun ? OutputTags::srun_label : OutputTags::mpirun_tag_output,
                 opt.console);
  Supervisor sup(plan, opt, out);
  const std::string where_logs = logs.empty() ? "" : fmt::format(" (rank logs: {}/rank_*.log)", logs);

  const std::string job = fmt::format("{}:{}:{}", host_info().hostname, ::getpid(), ::time(nullptr));
  for (int attempt = 1, restarts = 0;; ++attempt) {
    const bool is_restart = attempt > 1 || opt.previous_restarts > 0;
    const std::string checkpoint = is_restart ? checkpoint_to_resume(opt.checkpoint_dir) : "";
    std::vector<std::string> extra;
    if (!checkpoint.empty()) extra = resume_overrides();
    EnvList env = plan.env;
    env.push_back({kRestartCountEnv, std::to_string(opt.previous_restarts + attempt - 1)});
    env.push_back({kJobEnv, job});
    // Progress reports every quarter of the hang timeout (at most 30 s), and where flight records go.
    env.push_back({parallel::kProgressEnv, fmt::format("{}s", progress_interval_s(opt))});
    env.push_back({parallel::kFlightDirEnv, opt.log_dir.empty() ? "" : opt.log_dir + "/flight"});
    std::string scratch;
    if (plan.mode == LaunchMode::local_mpirun && !std::getenv("OMPI_MCA_orte_tmpdir_base")) {
      // Open MPI's session files and shared-memory segments of this attempt, removed afterwards:
      // a killed job would otherwise leave them in /tmp and /dev/shm.
      scratch = make_scratch_dir();
      if (!scratch.empty()) {
        env.push_back({"OMPI_MCA_orte_tmpdir_base", scratch});
        env.push_back({"OMPI_MCA_btl_vader_backing_directory", scratch});
      }
    }
    const std::vector<std::string> command = plan.command_with(extra);
    std::string header = fmt::format("attempt {} of {}", attempt, opt.max_restarts + 1);
    if (opt.previous_restarts > 0) header += fmt::format(" (Slurm restart {})", opt.previous_restarts);
    if (is_restart)
      header += checkpoint.empty() ? ", from the beginning (no complete checkpoint)" : ", resuming from " + checkpoint;
    out.begin_attempt(header, plan.world_size);
    std::string line;
    for (const auto& a : command) line += (line.empty() ? "" : " ") + shell_quote(a);
    out.launcher_message(fmt::format("{}: {}", header, line));

    int status = 0;
    try {
      status = sup.run_attempt(command, env);
    } catch (...) {
      if (!scratch.empty()) std::filesystem::remove_all(scratch);
      throw;
    }
    if (!scratch.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(scratch, ec);
    }

    if (sup.stop_requested()) {
      if (sup.hard_stop_by_user()) return 128 + SIGINT;
      if (status == kExitInterrupted || status == kExitOk) {
        out.launcher_message(status == kExitOk ? "the job finished before it could stop"
                                               : "the job stopped: every rank wrote its checkpoint and exited 75; run "
                                                 "the same command again to resume");
        return status;
      }
      out.launcher_message(
          fmt::format("the job ended with {} after the stop request (75 was expected: a rank did "
                      "not write its checkpoint in time or failed){}; not restarting",
                      describe_exit(status), where_logs));
      return status == 0 ? kExitFailure : launcher_exit_status(status);
    }
    // A hung attempt the supervisor ended failed, whatever its ranks' exit statuses became.
    const JobOutcome outcome = sup.hung() && status != kExitOk ? JobOutcome::failed : classify_exit(status);
    const std::string why = sup.hung() ? fmt::format(
                                             "it hung (no progress for launch.hang_timeout {}; the ranks "
                                             "were killed: {})",
                                             format_duration(opt.hang_timeout_s), describe_exit(status))
                                       : describe_exit(status);
    switch (outcome) {
      case JobOutcome::finished:
        out.launcher_message("the job finished (exit 0)");
        return kExitOk;
      case JobOutcome::user_error:
        out.launcher_message(
            fmt::format("the job stopped on a user error (exit 2): not restarted, since it would fail "
                        "the same way; the error is above{}",
                        where_logs));
        return kExitUserError;
      case JobOutcome::interrupted:
        out.launcher_message(
            "the job was interrupted (exit 75): its checkpoint is written; run the same command "
            "again to resume");
        return kExitInterrupted;
      case JobOutcome::failed:
        break;
    }
    if (restarts >= opt.max_restarts) {
      out.launcher_message(
          opt.max_restarts == 0
              ? fmt::format("the job failed: {}; set launch.max_restarts to restart failed jobs automatically{}", why,
                            where_logs)
              : fmt::format("the job failed: {}, and all {} restart(s) (launch.max_restarts) are used up; giving up{}",
                            why, opt.max_restarts, where_logs));
      return launcher_exit_status(status);  // 1: the failure itself is named above
    }
    ++restarts;
    const double wait = restart_backoff_s(restarts, opt.backoff_base_s, opt.backoff_max_s);
    const std::string next = checkpoint_to_resume(opt.checkpoint_dir);
    out.launcher_message(fmt::format(
        "the job failed: {}; restart {} of {} in {}, {}", why, restarts, opt.max_restarts, format_duration(wait),
        next.empty() ? fmt::format("from the beginning (no complete checkpoint in {})", opt.checkpoint_dir)
                     : "resuming from " + next + " (checkpoint.resume=auto)"));
    if (!sup.back_off(wait)) return kExitInterrupted;
  }
}

}  // namespace llmtrain::launcher
