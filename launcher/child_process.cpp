#include "launcher/child_process.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string_view>

extern char** environ;

#include "common/error.h"
#include "common/strings.h"

namespace llmtrain::launcher {
namespace {

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// In the child between fork and exec: only async-signal-safe calls.
[[noreturn]] void child_exec(const ChildSpec& spec, char* const* argv, char* const* envp, const std::string& path,
                             int out_w, int err_w, int report_w) {
  if (spec.own_process_group) setpgid(0, 0);
  if (spec.parent_death_signal) prctl(PR_SET_PDEATHSIG, spec.parent_death_signal);
  // Dispositions the supervisor changed must not leak into the job (SIG_IGN survives exec).
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int sig : {SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGCHLD}) sigaction(sig, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  int null_fd = ::open("/dev/null", O_RDONLY);
  if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
  if (out_w >= 0) dup2(out_w, STDOUT_FILENO);
  if (err_w >= 0) dup2(err_w, STDERR_FILENO);
  execve(path.c_str(), argv, envp);
  int err = errno;
  ssize_t ignored = ::write(report_w, &err, sizeof err);
  (void)ignored;
  _exit(127);
}

}  // namespace

int fold_wait_status(int ws) {
  if (WIFEXITED(ws)) return WEXITSTATUS(ws);
  if (WIFSIGNALED(ws)) return 128 + WTERMSIG(ws);
  return 1;
}

double monotonic_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

std::string find_program(const std::string& program) {
  if (program.find('/') != std::string::npos) return is_executable_file(program) ? program : "";
  const char* path = std::getenv("PATH");
  for (const std::string& dir : split(path ? path : "/usr/local/bin:/usr/bin:/bin", ':')) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (is_executable_file(candidate)) return candidate;
  }
  return "";
}

Child::Child(Child&& o) noexcept { *this = std::move(o); }

Child& Child::operator=(Child&& o) noexcept {
  if (this != &o) {
    close_fd(out_fd_);
    close_fd(err_fd_);
    pid_ = o.pid_;
    out_fd_ = o.out_fd_;
    err_fd_ = o.err_fd_;
    exited_ = o.exited_;
    status_ = o.status_;
    o.pid_ = -1;
    o.out_fd_ = o.err_fd_ = -1;
  }
  return *this;
}

Child::~Child() {
  close_fd(out_fd_);
  close_fd(err_fd_);
}

void Child::close_stdout() { close_fd(out_fd_); }
void Child::close_stderr() { close_fd(err_fd_); }

Child Child::spawn(const ChildSpec& spec) {
  LT_CHECK(!spec.argv.empty(), "spawn without a program");
  std::string path = find_program(spec.argv[0]);
  if (path.empty())
    throw environment_error(fmt::format("cannot run {}: not found on PATH", spec.argv[0]),
                            "install it or put its folder on PATH");
  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  std::vector<char*> argv;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; e && *e; ++e) {
    std::string_view entry(*e);
    bool overridden = false;
    for (const auto& kv : spec.env)
      overridden |= entry.size() > kv.first.size() && entry.starts_with(kv.first) && entry[kv.first.size()] == '=';
    if (!overridden) env_strings.emplace_back(entry);
  }
  for (const auto& [k, v] : spec.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1}, report[2] = {-1, -1};
  auto fail = [&](const char* what) {
    int err = errno;
    for (int* p : {out_pipe, err_pipe, report})
      for (int i = 0; i < 2; ++i) close_fd(p[i]);
    throw environment_error(fmt::format("cannot start {}: {} failed: {}", spec.argv[0], what, std::strerror(err)));
  };
  if (spec.capture_output && (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0)) fail("pipe");
  if (pipe2(report, O_CLOEXEC) != 0) fail("pipe");

  pid_t pid = fork();
  if (pid == 0) child_exec(spec, argv.data(), envp.data(), path, out_pipe[1], err_pipe[1], report[1]);
  int fork_errno = errno;
  close_fd(out_pipe[1]);
  close_fd(err_pipe[1]);
  close_fd(report[1]);
  if (pid < 0) {
    errno = fork_errno;
    fail("fork");
  }
  if (spec.own_process_group) setpgid(pid, pid);  // also here: no window where signals miss the group
  int exec_errno = 0;
  ssize_t n;
  do n = ::read(report[0], &exec_errno, sizeof exec_errno);
  while (n < 0 && errno == EINTR);
  close_fd(report[0]);
  if (n == static_cast<ssize_t>(sizeof exec_errno)) {
    int ws = 0;
    while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
    }
    close_fd(out_pipe[0]);
    close_fd(err_pipe[0]);
    throw environment_error(fmt::format("cannot run {} ({}): {}", spec.argv[0], path, std::strerror(exec_errno)),
                            "check that the program is executable");
  }
  Child c;
  c.pid_ = pid;
  c.out_fd_ = out_pipe[0];
  c.err_fd_ = err_pipe[0];
  return c;
}

bool Child::poll_exit(int& status) {
  if (exited_) {
    status = status_;
    return true;
  }
  if (pid_ <= 0) return false;
  int ws = 0;
  pid_t r = waitpid(pid_, &ws, WNOHANG);
  if (r != pid_) return false;
  exited_ = true;
  status_ = fold_wait_status(ws);
  status = status_;
  return true;
}

void Child::signal(int sig, bool group) const {
  if (pid_ <= 0 || exited_) return;
  if (group)
    ::kill(-pid_, sig);
  else
    ::kill(pid_, sig);
}

std::vector<CommandResult> run_commands(const std::vector<std::vector<std::string>>& argvs, double timeout_s,
                                        const std::vector<std::pair<std::string, std::string>>& env) {
  std::vector<CommandResult> results(argvs.size());
  std::vector<Child> children(argvs.size());
  for (size_t i = 0; i < argvs.size(); ++i) {
    ChildSpec spec;
    spec.argv = argvs[i];
    spec.env = env;
    try {
      children[i] = Child::spawn(spec);
    } catch (const Error& e) {
      results[i].start_error = e.what();
    }
  }
  const double deadline = monotonic_seconds() + timeout_s;
  bool killed = false;
  while (true) {
    std::vector<pollfd> fds;
    std::vector<std::pair<size_t, int>> owner;  // (child, 1 stdout | 2 stderr)
    bool running = false;
    for (size_t i = 0; i < children.size(); ++i) {
      Child& c = children[i];
      if (c.pid() <= 0) continue;
      int status = 0;
      bool exited = c.poll_exit(status);
      bool open = c.stdout_fd() >= 0 || c.stderr_fd() >= 0;
      if (exited && (!open || killed)) continue;
      running = true;
      if (c.stdout_fd() >= 0) fds.push_back({c.stdout_fd(), POLLIN, 0}), owner.push_back({i, 1});
      if (c.stderr_fd() >= 0) fds.push_back({c.stderr_fd(), POLLIN, 0}), owner.push_back({i, 2});
    }
    if (!running) break;
    if (fds.empty()) {
      ::usleep(10000);
    } else if (::poll(fds.data(), fds.size(), 50) > 0) {
      for (size_t k = 0; k < fds.size(); ++k) {
        if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        auto [i, stream] = owner[k];
        char buf[4096];
        ssize_t n = ::read(fds[k].fd, buf, sizeof buf);
        if (n > 0)
          results[i].output.append(buf, static_cast<size_t>(n));
        else if (n == 0 || errno != EINTR)
          stream == 1 ? children[i].close_stdout() : children[i].close_stderr();
      }
    }
    if (!killed && monotonic_seconds() >= deadline) {
      for (size_t i = 0; i < children.size(); ++i) {
        if (children[i].pid() <= 0 || children[i].exited()) continue;
        children[i].signal(SIGKILL, true);
        results[i].timed_out = true;
      }
      killed = true;
    }
  }
  for (size_t i = 0; i < children.size(); ++i)
    if (children[i].pid() > 0) results[i].status = children[i].status();
  return results;
}

CommandResult run_command(const std::vector<std::string>& argv, double timeout_s,
                          const std::vector<std::pair<std::string, std::string>>& env) {
  return run_commands({argv}, timeout_s, env).front();
}

}  // namespace llmtrain::launcher
