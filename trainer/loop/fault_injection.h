// Fault injection for the tests of failure handling: `LLMTRAIN_FAULT=<kind>@<step>[:<rank>]` makes
// the training loop fail right after completing step <step>, on world rank <rank> (every rank when
// omitted), in one of these ways:
//   kill   SIGKILL, as from `kill -9` or the OOM killer
//   segv   SIGSEGV, a crash
//   exit   exit(3) without finishing the job
//   throw  an llmtrain::Error thrown from the step (an environment failure)
//   hang   SIGSTOP: the rank stops responding; the others must hit parallel.timeout
//   slow   from step <step> on, the rank computes 10× as long as it did (it sleeps 9 × its step's
//          compute time, counted as forward time): a straggler, whatever the machine's speed, that
//          stays one when the other ranks' own compute times swing with the host's load
//   term   SIGTERM, as from a scheduler's preemption: the rank's handler asks for a stop, every rank
//          agrees (a max over the world), checkpoints this step and exits 75
//   kill-in-save
//          SIGKILL in the middle of step <step>'s checkpoint save: once the rank has written its
//          shard's bytes, before it fsyncs them (fault_file_system)
//   full-disk-in-save
//          the files of step <step>'s checkpoint cannot be created on this rank: ENOSPC, as from a
//          full disk (fault_file_system). A synchronous save fails the run; an asynchronous one is
//          a warning, and training goes on
//   term-in-save
//          (checkpoint.async only) SIGTERM from inside the background write of step <step>'s
//          checkpoint, before it writes anything; the writer then holds until the training loop
//          waits for it (fault_writer_hook), so the stop is handled while the write is in flight
//   offload-io-error
//          the next write to this rank's optimizer state file (parallel.offload: nvme) after step
//          <step> fails with EIO, as from the disk: the run ends naming the file (its checkpoints
//          intact)
// Unset, nothing happens. docs/testing.md lists it; it is not meant for production runs.
//
// train() holds it as a FaultInjector, an observer of the run (trainer/loop/run_observer.h): `slow`
// at step_done, before the step is reported; the other step faults at step_boundary, after the
// step's checkpoint; the save faults through the file system and writer hook it gives the
// checkpointer.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/file_io.h"
#include "trainer/loop/run_observer.h"
#include "trainer/optim/offload.h"

namespace llmtrain::trainer {

struct Fault {
  std::string kind;  // "" = none
  int64_t step = 0;
  int rank = -1;  // -1 = every rank
};

// Parses LLMTRAIN_FAULT; throws llmtrain::Error for a malformed value.
Fault fault_from_env();
// Fails as `fault` says when `step` and `rank` match it (not `slow`).
void fault_maybe_fire(const Fault& fault, int64_t step, int rank);
// For `offload-io-error`: whether the fault applies after `step` on `rank`.
bool fault_offload_io_error(const Fault& fault, int64_t step, int rank);
// For `kill-in-save` and `full-disk-in-save`: `base` wrapped so that this rank dies inside the save
// of the fault's step (or finds the disk full there),
// when the fault applies to `rank`; else null (use `base` itself).
std::unique_ptr<FileSystem> fault_file_system(const Fault& fault, int rank, FileSystem& base);
// For `term-in-save`: the hook the asynchronous writer runs (AsyncCheckpointWriter::WriterHook),
// when the fault applies to `rank`; else an empty function. Throws llmtrain::Error when the fault
// is term-in-save and `async` (checkpoint.async) is false: there is no background write to stop in.
std::function<void(int64_t step, const std::function<bool(double)>& wait_for_waiter)> fault_writer_hook(
    const Fault& fault, int rank, bool async);
// For `slow`: when the fault applies to `step` and `rank`, sleeps 9 × compute_s and returns the
// seconds slept; else returns 0 at once.
double fault_slow_down(const Fault& fault, int64_t step, int rank, double compute_s);

// LLMTRAIN_FAULT for one rank's run.
class FaultInjector final : public RunObserver {
 public:
  // Reads LLMTRAIN_FAULT (throws llmtrain::Error for a malformed value). `rank`: this world rank;
  // `offload`: the optimizer's offload store, whose file offload-io-error fails (null: none).
  FaultInjector(int rank, OffloadStore* offload);

  // What the checkpointer writes through: `base`, or the file system that fails inside the fault's
  // save (kill-in-save, full-disk-in-save; fault_file_system), which lives as long as this.
  FileSystem& file_system(FileSystem& base);
  // The checkpointer's writer hook (term-in-save; fault_writer_hook): empty for any other fault.
  std::function<void(int64_t step, const std::function<bool(double)>& wait_for_waiter)> writer_hook(bool async) const;

  void step_done(int64_t step, StepOutcome& outcome) override;  // slow: its sleep is forward time
  void step_boundary(int64_t step) override;                    // kill ... term, offload-io-error
  void run_end(int64_t, RunEnd) override {}

 private:
  Fault fault_;
  int rank_;
  OffloadStore* offload_;
  std::unique_ptr<FileSystem> fs_;
};

}  // namespace llmtrain::trainer
