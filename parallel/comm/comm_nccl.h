// The NCCL device communicator: device memory moved by NVIDIA's NCCL, each group on a
// communication stream of its own, ordered against the compute stream by events. It takes the
// staged communicator's place (parallel/comm/comm_staged.h) on cuda ranks of a build with NCCL
// (parallel.device_comm, docs/cuda.md "Communication").
//
// One operation on device tensors goes:
//   1. an event recorded on the compute stream behind the work queued so far, which the group's
//      communication stream waits for (the input is written; nothing queued before the call lands
//      on the output after the operation);
//   2. the NCCL call, queued on the communication stream, and an event behind it;
//   3. wait() makes the compute stream wait for that event and returns at once: the host never
//      blocks on a collective, and the compute stream's later work sees the result.
// Host tensors go straight to the host communicator, as on the staged one.
//
// Rules a reader could get wrong:
//  - The Comm contract holds (parallel/comm/comm.h), with no tags: a send or receive's tag is ignored
//    and each group's operations match in the order they are called (NCCL's rule; every caller
//    already keeps it: pipe links carry one kind of message one way, all_to_all_v is one grouped
//    exchange). An all-gather whose `in` is this rank's block of `out` (and a reduce-scatter whose
//    `out` is this rank's block of `in`) runs in place, as NCCL defines it.
//  - A 16-bit sum that accumulates in fp32 (Accumulate::fp32) is widened into an fp32 device
//    scratch on the compute stream, reduced in fp32 and rounded back by wait(): the wire carries
//    fp32, as on the staged path. The scratch is pooled per communicator (communication memory).
//  - Nothing hangs although wait() does not block: a watchdog thread polls every pending
//    operation's events and the communicator's asynchronous error. An operation that started on the
//    device (an event recorded just before its NCCL call has completed) and has not completed within
//    the timeout (parallel.timeout), one that has not started within 4 × the timeout (at least 60 s:
//    this rank's own work before it is stuck), or an error NCCL reports (a peer gone, a network
//    failure, ranks that called different collectives) aborts the communicator (ncclCommAbort,
//    which releases kernels stuck in it) and ends the job through abort_job, naming the operation,
//    the group, and which of the bounds ran out. Operations are recorded in the flight recorder
//    (parallel/comm/flight_recorder.h) by the caller's wrapper.
//  - Every NCCL call on a communicator is made under its state's mutex — enqueueing, polling, the
//    watchdog's abort, finalize and destroy — never under the watchdog's own lock.
//  - A handle (Work) owns what it needs: it may be waited for after its communicator is gone. One
//    dropped without wait() is a bug (fatal in debug builds, set_dropped_nccl_handles_fatal) and is
//    still completed: its 16-bit rounding back runs.
//  - The end of a communicator finalizes it (its operations in flight complete first, then
//    ncclCommFinalize polled until the group is quiescent) and destroys it; each step bounded by the
//    timeout, after which, or while an error unwinds, it is aborted instead.
//  - Creating one is collective over `host` and bounded by its timeout: rank 0 makes NCCL's unique
//    id and broadcasts it over `host`; every rank joins on its current device (the rank's device,
//    kernels/device_select.h, chosen before any communicator is made). One NCCL communicator per
//    mesh group (and per pipe link); split() makes another the same way over the host's split.
//  - Several ranks of one communicator on one GPU need NCCL ≥ 2.30 with
//    NCCL_MULTI_RANK_GPU_ENABLE=1 (older NCCL fails with "Duplicate GPU detected"): the choice is
//    made before the run by device_comm_problem().
#pragma once

#include <memory>
#include <string>

#include "parallel/comm/comm.h"

namespace llmtrain::parallel {

// Whether this binary has NCCL: NVIDIA's in a GPU build, the simulator's model of it in the SIM
// build (kernels/cuda/sim/sim_nccl.cpp), none in a CPU-only build.
bool nccl_built();
// Whether its communicators may join ranks of several processes: NVIDIA's do; the simulator's only
// join ranks that are threads of one process (mpirun jobs on the simulator stage instead).
bool nccl_spans_processes();
// The linked NCCL's version as major·10000 + minor·100 + patch; 0 when not built.
int nccl_version_code();
// The first NCCL that accepts several ranks of one communicator on one GPU (with
// NCCL_MULTI_RANK_GPU_ENABLE=1).
inline constexpr int kNcclMultiRankGpuVersion = 23000;

// For tests: a handle dropped without wait() is a bug; with `fatal` (the default in builds without
// NDEBUG) it ends the process naming the operation, otherwise it is completed quietly (the compute
// stream waits for it and its fp32 rounding back runs, as wait() would have done).
void set_dropped_nccl_handles_fatal(bool fatal);
// For tests only: while set, a communicator is aborted at its destruction instead of finalized,
// even with its operations in flight — the bug that leaves its peers waiting in them until their
// timeout (tests/parallel/comm/test_comm_nccl_sim.cpp shows it).
void plant_nccl_abort_on_teardown(bool on);

// Wraps `host` (kept, an MPI group of the same ranks) in an NCCL communicator of its ranks.
// Collective over `host`. Throws llmtrain::Error naming the group when NCCL cannot join (a build
// without NCCL says so).
std::unique_ptr<Comm> make_nccl_comm(std::unique_ptr<Comm> host);

}  // namespace llmtrain::parallel
