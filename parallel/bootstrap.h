// Bootstrap: making this process one rank of a job (docs/architecture.md §4).
//
//  - Started by mpirun or `srun --mpi=pmix` (parallel/launch_env.h says which): MPI is initialised
//    at MPI_THREAD_FUNNELED, rank and world size must equal what the launcher's environment said,
//    the local rank/size come from MPI_Comm_split_type(SHARED), nodes are numbered in the order
//    of their lowest world rank, and RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE are exported
//    as torchrun does.
//  - No launcher: one rank, MPI is NOT initialised, the world is a one-rank Comm.
//  - A plain `srun` without PMIx is refused with the fix (require_usable_launch).
//
// Why MPI_THREAD_FUNNELED: every MPI call is made by the thread that trains (OpenMP workers and
// BLAS threads never communicate), so more would only buy locking on every call. MULTIPLE would
// allow a progress thread, but on the few cores a CPU rank has that thread would take time from
// compute; overlap comes from polling instead (Comm::progress(), parallel/comm/comm_mpi.h). A library
// that provides less than FUNNELED is refused.
//
// Rules a reader could get wrong:
//  - Failure must end the job, not the rank: a rank's top level maps every error to abort_job()
//    (MPI_Abort), which rank_main() does. A rank that dies any other way is also made loud: fatal
//    signals, an exception that escapes (std::terminate) and exit() before finalize() print the
//    rank and cause, and the last two abort the job.
//  - finalize() is collective. It first waits on a barrier bounded by the timeout, because
//    MPI_Finalize itself would wait without bound for a rank that never comes.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "parallel/comm/comm.h"
#include "parallel/launch_env.h"

namespace llmtrain::parallel {

struct BootstrapOptions {
  // parallel.timeout: bounds every start-up step that waits for other ranks and becomes the
  // world communicator's timeout.
  double timeout_s = 300.0;
  // The world (and every group split from it) records its operations in the flight recorder
  // (parallel/comm/flight_recorder.h). Off only for tests that need the MpiComm itself.
  bool flight_recorder = true;
};

struct RankInfo {
  Launcher launcher = Launcher::none;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // among the ranks on this node
  int local_size = 1;
  int node = 0;  // nodes numbered in the order of their lowest world rank
  int nodes = 1;
  std::string hostname;
  bool mpi = false;              // MPI initialised (false for a process with no launcher)
  std::string mpi_thread_level;  // provided level, "MPI_THREAD_FUNNELED"; "" without MPI

  // "rank 3 of 4 (local 1 of 2, node 1 of 2, host n02) via mpirun (OMPI_COMM_WORLD_SIZE=4), MPI_THREAD_FUNNELED"
  std::string describe() const;
};

class Runtime {
 public:
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;
  // Finalises (see finalize) unless an exception is unwinding: then the catch site is expected to
  // call abort_job, and a collective finalize could wait for ranks that will never come.
  ~Runtime();

  const RankInfo& info() const { return info_; }

  // The world communicator, named "world" (an MPI duplicate of MPI_COMM_WORLD, or the one-rank
  // Comm). Handed out once, for make_mesh_comms.
  std::unique_ptr<Comm> take_world();

  // Ends MPI: a barrier bounded by the timeout, then MPI_Finalize. Every rank must call it (or
  // let the destructor do it). Communicators still alive afterwards free nothing. No-op without
  // MPI and when called again.
  void finalize();

 private:
  friend std::unique_ptr<Runtime> bootstrap(const LaunchEnv& env, const BootstrapOptions& options);
  Runtime() = default;

  RankInfo info_;
  std::unique_ptr<Comm> world_;
  std::unique_ptr<Comm> control_;  // bootstrap's own duplicate: node discovery, the final barrier
  bool finalized_ = false;
};

// Makes this process a rank (see the top of this file). Throws llmtrain::Error for a start that
// cannot work (srun without PMIx, a thread level below FUNNELED, an MPI world that disagrees with
// the launcher's environment, a start-up step that times out). MPI can be initialised once per
// process: a second bootstrap under a launcher is a bug.
std::unique_ptr<Runtime> bootstrap(const LaunchEnv& env, const BootstrapOptions& options = {});

// Ends the whole job promptly: prints `reason` (each line with the rank prefix) and the exit
// code to stderr, then MPI_Abort(MPI_COMM_WORLD, exit_code) when MPI is running, else _Exit.
// Under mpirun the job's exit status is `exit_code`.
[[noreturn]] void abort_job(const std::string& reason, int exit_code);

// A rank's top level: bootstrap, run `body`, finalize, return body's exit code. Under a launcher
// every llmtrain::Error (and any other exception) that escapes bootstrap or body ends the job
// through abort_job with the error's message and exit status (2 for user errors, 1 for the
// environment). With no launcher, errors propagate to the caller (cli's main prints them) as in
// any single-process command.
int rank_main(const LaunchEnv& env, const BootstrapOptions& options, const std::function<int(Runtime&)>& body);

}  // namespace llmtrain::parallel
