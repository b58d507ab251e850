// The NCCL device communicator: device memory moved by NVIDIA's NCCL, each group on a
// communication stream of its own, ordered against the compute stream by events. It takes the
// staged communicator's place (parallel/comm_staged.h) on cuda ranks of a build with NCCL
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
//  - The Comm contract holds (parallel/comm.h), with no tags: a send or receive's tag is ignored
//    and each group's operations match in the order they are called (NCCL's rule; every caller
//    already keeps it: pipe links carry one kind of message one way, all_to_all_v is one grouped
//    exchange). An all-gather whose `in` is this rank's block of `out` (and a reduce-scatter whose
//    `out` is this rank's block of `in`) runs in place, as NCCL defines it.
//  - A 16-bit sum that accumulates in fp32 (Accumulate::fp32) is widened into an fp32 device
//    scratch on the compute stream, reduced in fp32 and rounded back by wait(): the wire carries
//    fp32, as on the staged path. The scratch is pooled per communicator (communication memory).
//  - Nothing hangs although wait() does not block: a watchdog thread polls every pending
//    operation's event and the communicator's asynchronous error. An operation pending longer
//    than the timeout (parallel.timeout), or an error NCCL reports (a peer gone, a network
//    failure), aborts the communicator (ncclCommAbort, which releases kernels stuck in it) and ends
//    the job through abort_job, naming the operation, the group and the peer. Operations are
//    recorded in the flight recorder (parallel/flight_recorder.h) by the caller's wrapper.
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

#include "parallel/comm.h"

namespace llmtrain::parallel {

// Whether this binary links NCCL (the CUDA backend on a GPU build; not the simulator's).
bool nccl_built();
// The linked NCCL's version as major·10000 + minor·100 + patch; 0 when not built.
int nccl_version_code();
// The first NCCL that accepts several ranks of one communicator on one GPU (with
// NCCL_MULTI_RANK_GPU_ENABLE=1).
inline constexpr int kNcclMultiRankGpuVersion = 23000;

// Wraps `host` (kept, an MPI group of the same ranks) in an NCCL communicator of its ranks.
// Collective over `host`. Throws llmtrain::Error naming the group when NCCL cannot join (a build
// without NCCL says so).
std::unique_ptr<Comm> make_nccl_comm(std::unique_ptr<Comm> host);

}  // namespace llmtrain::parallel
