// Asynchronous checkpoint saves (checkpoint.async): the step is held only while each rank copies
// the slices it writes into host memory; a background thread then writes them with the protocol
// of checkpoint_save (trainer/checkpoint/checkpoint.h), and training goes on.
//
// The save's three stages run where the communicator allows (MPI is initialized
// MPI_THREAD_FUNNELED: only the training thread communicates):
//   start()   training thread, collective: rank 0 makes step_<N>.partial/; every rank copies its
//             written slices into its snapshot (a device → host copy on cuda ranks, through
//             kernels::copy) and starts its writer thread.
//   writer    background thread, no communication: this rank's shard file (checksums, fsync), and
//             on rank 0 the tokenizer's copy; it records the result (or failure) and says it is done.
//   commit    training thread, collective: poll() at each step boundary asks every rank whether
//             its writer is done (a max of a "still writing" flag over the world); when all are,
//             they agree on failures and rank 0 writes the manifest, renames the directory into
//             place, replaces `latest` and applies retention. finish() waits for this rank's writer (bounded by
//             checkpoint.timeout) and then commits the same way.
//
// Rules a reader could get wrong:
//  - At most one save is in flight. start() requires none (the caller finish()es the previous one);
//    poll() and finish() are collective and every rank calls them at the same step boundaries.
//  - A failed write on any rank is agreed by all: no rank commits, `latest` keeps naming the
//    previous checkpoint, rank 0 removes the failed `.partial`, and poll()/finish() return the
//    failure (the message names the rank and the path) instead of throwing, so training goes on.
//  - The writer thread never throws out of itself, never logs and never communicates; the snapshot
//    and the job's state are shared with it, so even a writer abandoned after a timeout (or by the
//    destructor on an error path, which waits for it but commits nothing) reads valid memory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/file_io.h"
#include "kernels/buffer.h"
#include "parallel/comm/comm.h"
#include "trainer/checkpoint/checkpoint.h"

namespace llmtrain::trainer {

// A save that left the training thread: committed (path set) or failed (error set).
struct AsyncSaveResult {
  int64_t step = 0;
  std::string path;     // the step directory, when committed
  std::string error;    // why it was not committed ("" when it was), naming the rank and path
  double held_s = 0;    // the step boundary held for the snapshot (and preparing the directory)
  double write_s = 0;   // this rank's background write, from its start to its end
  double commit_s = 0;  // the commit on the training thread (the wait for the writer included)
  bool committed() const { return error.empty(); }
};

class AsyncCheckpointWriter {
 public:
  // A test hook (fault injection): called on the writer thread of every save before it writes;
  // `wait_for_waiter(seconds)` blocks until the training thread waits for this save (finish()),
  // returning false when that did not happen within `seconds`.
  using WriterHook = std::function<void(int64_t step, const std::function<bool(double)>& wait_for_waiter)>;

  // `fs`, `world` must outlive the writer. `timeout_s` bounds finish()'s wait for the writer.
  AsyncCheckpointWriter(FileSystem& fs, std::string dir, int keep, parallel::Comm& world, double timeout_s);
  // Waits (within the timeout) for a writer still running, and commits nothing: it is reached
  // normally with nothing in flight, or on an error path where no collective may be started.
  ~AsyncCheckpointWriter();
  AsyncCheckpointWriter(const AsyncCheckpointWriter&) = delete;
  AsyncCheckpointWriter& operator=(const AsyncCheckpointWriter&) = delete;

  // Collective. Snapshots the slices of `live` this rank writes and starts writing step
  // `meta.step` in the background; the result's held_s is how long that held the caller. When
  // preparing the directory fails (on any rank) nothing starts: the result carries the failure and
  // in_flight() stays false.
  AsyncSaveResult start(const CheckpointMeta& meta, const std::vector<CheckpointSlice>& live);
  bool in_flight() const { return job_ != nullptr; }
  int64_t in_flight_step() const;
  // Collective, cheap: when every rank's writer is done, commits and returns the result; else
  // nullopt (also when nothing is in flight).
  std::optional<AsyncSaveResult> poll();
  // Collective: waits for this rank's writer, then commits; nullopt when nothing was in flight.
  // Throws llmtrain::Error when the writer does not finish within the timeout.
  std::optional<AsyncSaveResult> finish();

  // Allocates the snapshot for `slices` (as start() will be given them) now, at the run's start, so
  // that no save holds the step for the allocation (zeroed pages of a large model take seconds).
  void reserve(const std::vector<CheckpointSlice>& slices);
  // Host bytes the snapshot holds (0 before reserve() or the first save): the slices this rank
  // writes, fp32.
  int64_t snapshot_bytes() const { return snapshot_bytes_; }
  // The snapshot's size for `slices` (those this rank writes): what start() allocates.
  static int64_t snapshot_bytes_of(const std::vector<CheckpointSlice>& slices);

  void set_hook(WriterHook hook) { hook_ = std::move(hook); }

 private:
  struct Job;
  AsyncSaveResult commit();

  FileSystem& fs_;
  std::string dir_;
  int keep_;
  parallel::Comm& world_;
  double timeout_s_;
  WriterHook hook_;
  std::shared_ptr<Job> job_;            // the save in flight
  std::vector<kernels::Buffer> spare_;  // the snapshot's buffers between saves (reused)
  int64_t snapshot_bytes_ = 0;
};

}  // namespace llmtrain::trainer
