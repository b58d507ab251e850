#include "parallel/bootstrap.h"

#include <fmt/format.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <vector>

#include "common/enum_names.h"
#include "common/error.h"
#include "common/log.h"
#include "common/strings.h"
#include "parallel/comm/comm_mpi.h"
#include "parallel/comm/flight_recorder.h"
#include "parallel/comm/mpi_check.h"
#include "parallel/progress.h"

namespace llmtrain::parallel {
namespace {

// Where this process stands with MPI, for the handlers below (which may run at any time).
enum MpiState : int { kNoMpi = 0, kMpiRunning = 1, kMpiFinalized = 2, kAborting = 3 };
std::atomic<int> g_mpi_state{kNoMpi};

const char* thread_level_name(int level) {
  static constexpr EnumName<int> kNames[] = {{"MPI_THREAD_SINGLE", MPI_THREAD_SINGLE},
                                             {"MPI_THREAD_FUNNELED", MPI_THREAD_FUNNELED},
                                             {"MPI_THREAD_SERIALIZED", MPI_THREAD_SERIALIZED},
                                             {"MPI_THREAD_MULTIPLE", MPI_THREAD_MULTIPLE}};
  return enum_name(kNames, level, "unknown");
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

void export_torchrun_env(const RankInfo& info) {
  // torchrun's names, so that tools and scripts written for it find their rank.
  setenv("RANK", std::to_string(info.rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(info.world_size).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(info.local_rank).c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", std::to_string(info.local_size).c_str(), 1);
}

// --- making a dying rank loud --------------------------------------------------------------

// Fatal signals: the message is prepared at install time because a handler may only call
// async-signal-safe functions (write, sigaction, raise). After printing, the previous handler
// (Open MPI's backtrace printer) is restored and the signal raised again.
constexpr int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
constexpr int kNumFatal = sizeof kFatalSignals / sizeof kFatalSignals[0];
char g_signal_text[kNumFatal][320];
struct sigaction g_previous[kNumFatal];

void on_fatal_signal(int sig) {
  for (int i = 0; i < kNumFatal; ++i) {
    if (kFatalSignals[i] != sig) continue;
    ssize_t ignored = write(STDERR_FILENO, g_signal_text[i], std::strlen(g_signal_text[i]));
    (void)ignored;
    flight_recorder().dump_from_signal();
    sigaction(sig, &g_previous[i], nullptr);
    raise(sig);  // delivered when this handler returns, to the previous handler
    return;
  }
}

void install_signal_handlers(const RankInfo& info) {
  for (int i = 0; i < kNumFatal; ++i) {
    const int sig = kFatalSignals[i];
    std::snprintf(g_signal_text[i], sizeof g_signal_text[i],
                  "%sfatal: rank %d (pid %d on %s) received signal %d (%s); the job ends\n", log_prefix().c_str(),
                  info.rank, static_cast<int>(getpid()), info.hostname.c_str(), sig, strsignal(sig));
    struct sigaction sa {};
    sa.sa_handler = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, &g_previous[i]);
  }
}

// exit() before finalize(): the rank left the job, which cannot go on without it. Say so with
// the status, and take the job down now rather than when the launcher notices.
void on_exit_before_finalize(int status, void*) {
  int expected = kMpiRunning;
  if (!g_mpi_state.compare_exchange_strong(expected, kAborting)) return;
  std::fprintf(stderr, "%sfatal: rank %d called exit(%d) before the job finished; the job ends\n", log_prefix().c_str(),
               log_rank(), status);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, status != 0 ? status : kExitFailure);
}

// An exception that escaped (a thread's function, a destructor during unwinding, noexcept code).
void on_terminate() {
  std::string what = "unknown exception";
  if (auto e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const Error& err) {
      what = format_error(err);
    } catch (const std::exception& err) {
      what = err.what();
    } catch (...) {
    }
  } else {
    what = "std::terminate called without an exception";
  }
  abort_job("fatal: uncaught exception: " + what, kExitFailure);
}

// Blocking MPI calls that have no nonblocking form are fenced by a bounded barrier first.
void fence(Comm& comm) { comm.barrier(); }

}  // namespace

std::string RankInfo::describe() const {
  static constexpr EnumName<Launcher> kVia[] = {{"mpirun", Launcher::mpirun},
                                                {"srun --mpi=pmix", Launcher::srun_pmix},
                                                {"srun without PMIx", Launcher::srun_no_pmix},
                                                {"no launcher (MPI not initialised)", Launcher::none}};
  const std::string via = enum_name(kVia, launcher, "");
  std::string out = fmt::format("rank {} of {} (local {} of {}, node {} of {}, host {}) via {}", rank, world_size,
                                local_rank, local_size, node, nodes, hostname, via);
  if (!mpi_thread_level.empty()) out += ", " + mpi_thread_level;
  return out;
}

std::unique_ptr<Runtime> bootstrap(const LaunchEnv& env, const BootstrapOptions& options) {
  require_usable_launch(env);
  LT_CHECK(options.timeout_s > 0, "bootstrap timeout {}", options.timeout_s);
  std::unique_ptr<Runtime> rt(new Runtime);
  RankInfo& info = rt->info_;
  info.launcher = env.launcher;
  info.hostname = host_name();

  if (!env.is_rank()) {
    log_set_rank(0, 1);
    export_torchrun_env(info);
    rt->world_ = make_local_comm("world");
    rt->world_->set_timeout(options.timeout_s);
    return rt;
  }

  int initialized = 0;
  MPI_Initialized(&initialized);
  LT_CHECK(!initialized, "bootstrap() called twice in one process (MPI can be initialised once)");
  int provided = -1;
  LT_MPI(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
  g_mpi_state = kMpiRunning;
  info.mpi = true;
  info.mpi_thread_level = thread_level_name(provided);
  // Errors come back as codes (LT_MPI turns them into llmtrain::Error) instead of aborting.
  // (MPI_COMM_SELF too: errors of calls without a communicator, e.g. datatype creation, are raised
  // on one of the two depending on the MPI version.)
  LT_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  LT_MPI(MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN));
  LT_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &info.rank));
  LT_MPI(MPI_Comm_size(MPI_COMM_WORLD, &info.world_size));
  log_set_rank(info.rank, info.world_size);
  install_signal_handlers(info);
  on_exit(on_exit_before_finalize, nullptr);
  std::set_terminate(on_terminate);

  if (provided < MPI_THREAD_FUNNELED)
    throw environment_error(
        fmt::format("the MPI library provides {} but llmtrain needs MPI_THREAD_FUNNELED", thread_level_name(provided)),
        "use an MPI built with thread support (Debian's Open MPI is); see `llmtrain env` for the library in use");
  if (info.rank != env.rank || info.world_size != env.world_size)
    throw environment_error(
        fmt::format("MPI says this is rank {} of {}, but the launcher's environment says rank {} of {} ({})", info.rank,
                    info.world_size, env.rank, env.world_size, env.world_source()),
        "the MPI library and the launcher do not belong together: start llmtrain with the mpirun of the MPI it was "
        "built with (`llmtrain env` names it), or with `srun --mpi=pmix`");

  rt->control_ = make_mpi_world_comm(options.timeout_s, "bootstrap");
  auto* control = static_cast<MpiComm*>(rt->control_.get());

  // Ranks sharing this node's memory.
  fence(*control);
  MPI_Comm node_handle = MPI_COMM_NULL;
  LT_MPI(MPI_Comm_split_type(control->handle(), MPI_COMM_TYPE_SHARED, info.rank, MPI_INFO_NULL, &node_handle));
  MpiComm node(node_handle, "node", options.timeout_s);
  info.local_rank = node.rank();
  info.local_size = node.size();
  if (env.launcher == Launcher::mpirun && (info.local_rank != env.local_rank || info.local_size != env.local_size))
    log_warn("MPI places this rank as local {} of {}, mpirun's environment said {} of {}; using MPI's", info.local_rank,
             info.local_size, env.local_rank, env.local_size);

  // A node is named by its lowest world rank; nodes are numbered in the order of those.
  int32_t lowest = -info.rank;
  node.all_reduce(kernels::Tensor(&lowest, kernels::DType::int32, {1}), ReduceOp::max);
  lowest = -lowest;
  std::vector<int32_t> lowest_of(static_cast<size_t>(info.world_size));
  control->all_gather(kernels::Tensor(&lowest, kernels::DType::int32, {1}),
                      kernels::Tensor(lowest_of.data(), kernels::DType::int32, {info.world_size}));
  std::sort(lowest_of.begin(), lowest_of.end());
  lowest_of.erase(std::unique(lowest_of.begin(), lowest_of.end()), lowest_of.end());
  info.nodes = static_cast<int>(lowest_of.size());
  info.node = static_cast<int>(std::lower_bound(lowest_of.begin(), lowest_of.end(), lowest) - lowest_of.begin());

  export_torchrun_env(info);
  // Every operation on the world and the groups split from it goes into the flight recorder.
  rt->world_ = make_mpi_world_comm(options.timeout_s, "world");
  if (options.flight_recorder) rt->world_ = with_flight_recorder(std::move(rt->world_));
  log_debug("bootstrap: {}", info.describe());
  return rt;
}

std::unique_ptr<Comm> Runtime::take_world() {
  LT_CHECK(world_ != nullptr, "Runtime::take_world() called twice");
  return std::move(world_);
}

void Runtime::finalize() {
  if (finalized_) return;
  finalized_ = true;
  if (!info_.mpi) return;
  control_->barrier();
  control_.reset();
  world_.reset();
  int expected = kMpiRunning;
  if (!g_mpi_state.compare_exchange_strong(expected, kMpiFinalized)) return;  // aborting
  LT_MPI(MPI_Finalize());
}

Runtime::~Runtime() {
  if (finalized_ || std::uncaught_exceptions() > 0) return;
  try {
    finalize();
  } catch (const Error& e) {
    abort_job(format_error(e), e.exit_code());
  }
}

void abort_job(const std::string& reason, int exit_code) {
  const std::string& prefix = log_prefix();
  std::string text;
  for (const auto& line : split(printable(reason, /*keep_newlines=*/true), '\n')) text += prefix + line + "\n";
  text += fmt::format("{}ending the job (exit status {})\n", prefix, exit_code);
  // The communication operations that led here (a timed-out collective names its group; the
  // record shows what the others were doing), when the supervisor gave a folder for them.
  const std::string flight = flight_recorder().dump();
  if (!flight.empty()) text += fmt::format("{}flight record of this rank's last operations: {}\n", prefix, flight);
  std::fflush(stdout);
  std::fputs(text.c_str(), stderr);
  std::fflush(stderr);
  int expected = kMpiRunning;
  if (g_mpi_state.compare_exchange_strong(expected, kAborting)) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

int rank_main(const LaunchEnv& env, const BootstrapOptions& options, const std::function<int(Runtime&)>& body) {
  if (!env.is_rank()) {
    auto rt = bootstrap(env, options);
    return body(*rt);
  }
  try {
    auto rt = bootstrap(env, options);
    start_progress_reporter(rt->info().rank);
    const int status = body(*rt);
    stop_progress_reporter();
    rt->finalize();
    return status;
  } catch (const Error& e) {
    abort_job(format_error(e), e.exit_code());
  } catch (const std::exception& e) {
    abort_job(fmt::format("internal error: {}", e.what()), kExitFailure);
  }
}

}  // namespace llmtrain::parallel
