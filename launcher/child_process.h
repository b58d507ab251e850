// Child processes for the launcher: the launcher program of a job (mpirun, srun) in a process
// group of its own with its output on pipes, and short helper commands (ssh probes, squeue,
// sbatch) run to completion under a time limit.
//
// Rules a reader could get wrong:
//  - The job's launcher program gets its own process group, so a Ctrl-C on the terminal reaches
//    only the supervisor, which decides what the ranks get (mpirun would otherwise kill them all
//    within a second, and srun would SIGKILL them).
//  - Exit statuses are folded into one int the way a shell does: the exit code, or 128 + the
//    signal that killed the process.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace llmtrain::launcher {

struct ChildSpec {
  std::vector<std::string> argv;                         // argv[0] is looked up on PATH
  std::vector<std::pair<std::string, std::string>> env;  // set (overriding) in the child's environment
  bool own_process_group = true;
  bool capture_output = true;  // stdout/stderr on pipes (else inherited)
  // Signal the child gets when the supervisor dies (PR_SET_PDEATHSIG); 0 for none.
  int parent_death_signal = 0;
};

class Child {
 public:
  Child() = default;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  Child(Child&& other) noexcept;
  Child& operator=(Child&& other) noexcept;
  ~Child();  // closes the pipes; does not kill or wait

  // Starts the child. Throws llmtrain::Error when the program cannot be executed (not found, not
  // executable), with the system's reason.
  static Child spawn(const ChildSpec& spec);

  pid_t pid() const { return pid_; }
  int stdout_fd() const { return out_fd_; }
  int stderr_fd() const { return err_fd_; }
  void close_stdout();
  void close_stderr();

  // Non-blocking: true once the child has exited, with its status folded into `status`.
  bool poll_exit(int& status);
  bool exited() const { return exited_; }
  int status() const { return status_; }
  // Sends `sig` to the child (or, with `group`, to its whole process group). No-op after exit.
  void signal(int sig, bool group = false) const;

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  bool exited_ = false;
  int status_ = 0;
};

// The shell's folding of a waitpid status: exit code, or 128 + signal.
int fold_wait_status(int wait_status);

struct CommandResult {
  int status = -1;     // folded exit status; -1 when it could not start
  std::string output;  // stdout and stderr, interleaved as they came
  bool timed_out = false;
  std::string start_error;  // why it could not start
};

// Runs a short command to completion, killing its process group after `timeout_s` seconds.
CommandResult run_command(const std::vector<std::string>& argv, double timeout_s,
                          const std::vector<std::pair<std::string, std::string>>& env = {});

// Runs several short commands at once (ssh probes of every host), each bounded by `timeout_s`.
std::vector<CommandResult> run_commands(const std::vector<std::vector<std::string>>& argvs, double timeout_s,
                                        const std::vector<std::pair<std::string, std::string>>& env = {});

// The full path of `program` on PATH ("" when absent). A name with a slash is checked as it is.
std::string find_program(const std::string& program);

// Seconds on a monotonic clock.
double monotonic_seconds();

}  // namespace llmtrain::launcher
