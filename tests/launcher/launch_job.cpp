// A small real job for the launcher tests (tests/launcher/*.sh): every rank bootstraps through
// parallel::rank_main, runs a few "steps" (a sleep and an all-reduce, so the ranks really talk),
// and can be told to fail, hang, or be stopped. It stands in for training until the training loop
// exists, and behaves the way the launcher expects a training job to:
//  - SIGTERM (or the launcher's SIGUSR1 relay): every rank agrees to stop at the same step (an
//    all-reduce of the flag), writes a "checkpoint" and exits 75 — through the trainer's real stop
//    handlers, which exit 128 + signal at once on a second signal, so a duplicate shows;
//  - checkpoints: <ckpt-dir>/step_<8 digits>/manifest.json and <ckpt-dir>/latest, written by rank 0;
//    a start finds the newest one and resumes after it (what checkpoint.resume: auto does);
//  - a failure is an exit code, a signal or a hang, on one chosen rank at one chosen step.
//
//   launch_job [--steps N] [--step-ms MS] [--ckpt-dir DIR] [--ckpt-every K] [--ckpt-ms MS]
//              [--fail-rank R --fail-at S --fail exit:CODE|kill|segv|user-error|hang] [--fail-once]
//              [--leave-behind PIDFILE] [--ignore-stop] [--timeout SECONDS] [--set KEY=VALUE]...
//
// --leave-behind: before failing, the failing rank starts a process that outlives it (its own
// process group, deaf to SIGTERM, SIGINT and SIGHUP, sleeping two minutes) and writes its pid to
// PIDFILE — what a data-loader worker or a stuck helper of a crashed rank would be.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/checkpoint_dir.h"
#include "common/error.h"
#include "common/file_io.h"
#include "common/signals.h"
#include "launcher/launch_plan.h"
#include "launcher/restart_policy.h"
#include "launcher/stop_relay.h"
#include "parallel/bootstrap.h"
#include "parallel/progress.h"

using namespace llmtrain;
namespace fs = std::filesystem;

namespace {

struct Options {
  int steps = 5;
  int step_ms = 100;
  std::string ckpt_dir;
  int ckpt_every = 1;
  int ckpt_ms = 200;
  int fail_rank = -1;
  int fail_at = -1;
  std::string fail;
  bool fail_once = false;
  bool ignore_stop = false;
  std::string leave_behind;
  double timeout_s = 120;
  std::vector<std::string> sets;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw Error("launch_job: " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--steps")
      o.steps = std::stoi(next());
    else if (a == "--step-ms")
      o.step_ms = std::stoi(next());
    else if (a == "--ckpt-dir")
      o.ckpt_dir = next();
    else if (a == "--ckpt-every")
      o.ckpt_every = std::stoi(next());
    else if (a == "--ckpt-ms")
      o.ckpt_ms = std::stoi(next());
    else if (a == "--fail-rank")
      o.fail_rank = std::stoi(next());
    else if (a == "--fail-at")
      o.fail_at = std::stoi(next());
    else if (a == "--fail")
      o.fail = next();
    else if (a == "--fail-once")
      o.fail_once = true;
    else if (a == "--leave-behind")
      o.leave_behind = next();
    else if (a == "--ignore-stop")
      o.ignore_stop = true;
    else if (a == "--timeout")
      o.timeout_s = std::stod(next());
    else if (a == "--set")
      o.sets.push_back(next());
    else
      throw Error("launch_job: unknown argument " + a);
  }
  return o;
}

int newest_step(const std::string& dir) {
  std::string path = checkpoint_to_resume(dir);
  return path.empty() ? 0 : static_cast<int>(checkpoint_parse_step_dir(fs::path(path).filename().string()));
}

void save_checkpoint(const std::string& dir, int step) {
  FileSystem& fs_ = default_file_system();
  std::string name = checkpoint_step_dir(step);
  fs_.make_dirs(dir + "/" + name);
  write_file_atomic(fs_, dir + "/" + name + "/" + kManifestFile, "{\"step\": " + std::to_string(step) + "}\n");
  write_file_atomic(fs_, dir + "/" + kLatestFile, name + "\n");
}

void inject(const Options& o) {
  if (o.fail_once) {
    std::string marker = o.ckpt_dir + "/failed-once";
    if (fs::exists(marker)) return;
    std::ofstream(marker) << "1\n";
  }
  if (!o.leave_behind.empty()) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      for (int sig : {SIGTERM, SIGINT, SIGHUP}) std::signal(sig, SIG_IGN);
      std::ofstream(o.leave_behind + ".tmp") << ::getpid() << "\n";
      fs::rename(o.leave_behind + ".tmp", o.leave_behind);
      std::this_thread::sleep_for(std::chrono::minutes(2));
      std::_Exit(0);
    }
    // The rank fails only once its leftover is there to be found.
    for (int i = 0; i < 1000 && !fs::exists(o.leave_behind); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::printf("injecting failure '%s'\n", o.fail.c_str());
  std::fflush(stdout);
  if (o.fail.rfind("exit:", 0) == 0) std::exit(std::stoi(o.fail.substr(5)));
  if (o.fail == "kill") ::raise(SIGKILL);
  if (o.fail == "segv") ::raise(SIGSEGV);
  if (o.fail == "user-error") throw Error("injected user error", "this is the launcher test's job program");
  if (o.fail == "hang") std::this_thread::sleep_for(std::chrono::hours(1));
  throw Error("launch_job: unknown --fail " + o.fail);
}

// The name of this process's parent: mpirun (local ranks), orted (ranks mpirun started over ssh),
// slurmstepd (srun).
std::string parent_name() {
  std::ifstream in("/proc/" + std::to_string(getppid()) + "/comm");
  std::string name;
  std::getline(in, name);
  return name.empty() ? "?" : name;
}

int body(const Options& o, parallel::Runtime& rt) {
  const parallel::RankInfo& info = rt.info();
  auto world = rt.take_world();
  const char* threads = std::getenv("OMP_NUM_THREADS");
  const char* restart = std::getenv(launcher::kRestartCountEnv);
  std::string sets;
  for (const auto& s : o.sets) sets += " " + s;
  std::printf("rank %d of %d: local %s of %s, host %s, pid %d, parent %s, OMP_NUM_THREADS=%s, restart %s, sets:%s\n",
              info.rank, info.world_size, std::getenv("LOCAL_RANK"), std::getenv("LOCAL_WORLD_SIZE"),
              info.hostname.c_str(), static_cast<int>(getpid()), parent_name().c_str(), threads ? threads : "unset",
              restart ? restart : "unset", sets.empty() ? " none" : sets.c_str());
  std::fflush(stdout);
  int start = o.ckpt_dir.empty() ? 0 : newest_step(o.ckpt_dir);
  if (start > 0 && info.rank == 0) std::printf("resuming after step %d\n", start);
  for (int step = start + 1; step <= o.steps; ++step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(o.step_ms));
    if (info.rank == o.fail_rank && step == o.fail_at) inject(o);
    float flags[2] = {1.0f, stop_requested() && !o.ignore_stop ? 1.0f : 0.0f};
    world->all_reduce(kernels::host_tensor(flags, {2}), parallel::ReduceOp::max);
    parallel::set_progress(step, parallel::Phase::train);  // what the supervisor's hang detection watches
    if (info.rank == 0) std::printf("step %d done\n", step);
    std::fflush(stdout);
    if (flags[1] > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(o.ckpt_ms));
      if (info.rank == 0 && !o.ckpt_dir.empty()) save_checkpoint(o.ckpt_dir, step);
      world->barrier();
      std::printf("stopping after step %d (signal %d): checkpoint written, exit 75\n", step,
                  stop_signal() ? stop_signal() : 0);
      std::fflush(stdout);
      return kExitInterrupted;
    }
    if (info.rank == 0 && !o.ckpt_dir.empty() && step % o.ckpt_every == 0) save_checkpoint(o.ckpt_dir, step);
  }
  world->barrier();
  std::printf("finished %d steps\n", o.steps);
  std::fflush(stdout);
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Options o = parse(argc, argv);
    install_stop_handlers();
    launcher::install_stop_relay();
    parallel::LaunchEnv env = parallel::detect_launch_env();
    return parallel::rank_main(env, {.timeout_s = o.timeout_s}, [&](parallel::Runtime& rt) { return body(o, rt); });
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", format_error(e).c_str());
    return e.exit_code();
  }
}
