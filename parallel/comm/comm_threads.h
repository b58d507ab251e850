// In-process communicators: N ranks as N threads of one process, talking through a real
// implementation of Comm. Tests of tensor-, pipeline- and ZeRO-parallel code run their ranks this
// way, without mpirun (docs/architecture.md §3, "The step engine and its seams"); the mpirun tests check the
// same layouts end to end over MpiComm. Only tests use it; it stands here, beside comm.h and MpiComm,
// because it is a backend of that interface and must keep its guarantees (below) as they change.
//
// Guarantees (those of parallel/comm/comm.h, as MpiComm keeps them):
//  - The whole interface: every collective and its async form, send/recv with tags, split (MPI_Comm_split
//    semantics: same color, one group, ranked by key then by rank), timeouts, progress().
//  - Reductions in rank order (rank 0 + rank 1 + ...), computed once for the whole group, so every
//    rank gets bitwise the same result. fp32 and the integer types reduce natively (integer sums
//    wrap); bf16 and fp16 are widened to fp32, reduced and rounded once; avg is the sum divided by
//    the group size in fp32 (x / n).
//  - Every wait is bounded by the communicator's timeout and throws llmtrain::Error naming the
//    operation, the group, its size and (send/recv) the peer, worded as MpiComm's.
//  - Ranks that start different collectives (kind, element count, dtype, reduce op, root) as
//    their k-th on a group, or a send and a receive of different sizes, get an Error saying so
//    instead of a corrupted buffer.
//  - A failure anywhere ends the whole in-process job, as abort_job ends an MPI job: once a rank of
//    run_ranks_in_threads throws, a wait times out or a mismatch is found, every rank waiting on
//    the world or on any group split from it (or starting an operation there later) throws at once,
//    naming the rank that failed first. A rank whose function returned while another waits for it
//    in an operation it never started is reported at once too.
//
// Rules a reader could get wrong:
//  - An operation is carried out by the thread of the last rank to start it: that thread reads
//    every rank's input and writes every rank's output. So a rank's buffers are touched by other
//    threads between its call and the return of its wait(), never outside that window (the rule of
//    comm.h). There is no progress thread and nothing for progress() to do.
//  - A send completes when the matching receive has taken its data, as a large MPI message does:
//    a blocking send on both sides first never completes here (it times out), as under MPI; the
//    deadlock-free form, send_async on both sides then the receives, works.
//  - Host memory only.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/comm.h"

namespace llmtrain::parallel {

// `n` communicators of one group named `name`, one per rank: hand comms[r] to the thread that plays
// rank r. Waits on them are bounded by `timeout_s` (set_timeout changes one rank's bound).
std::vector<std::unique_ptr<Comm>> make_thread_comms(int n, std::string name = "world", double timeout_s = 60.0);

// Runs fn(world) on `n` threads (rank r gets comms[r] of make_thread_comms(n, "world",
// timeout_s)) and joins them all. If a rank throws, the job fails (see above) and the error of the
// rank that failed first is rethrown as an llmtrain::Error naming that rank. Each thread first sets
// omp_set_num_threads(1), so that n ranks do not oversubscribe the cores.
void run_ranks_in_threads(int n, const std::function<void(Comm& world)>& fn, double timeout_s = 60.0);

}  // namespace llmtrain::parallel
