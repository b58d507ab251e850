// The one polling loop behind every bounded wait on another rank (Comm waits, bootstrap steps).
//
// Two needs pull against each other:
//  - A waiting rank must not burn a core: on a machine with fewer cores than ranks (CI: 4 ranks
//    on 2 cores) a spinning waiter steals the time the rank it waits for needs.
//  - MPI moves data only while some rank polls: a large message over shared memory without a
//    single-copy mechanism goes in 32 KiB fragments, each needing a poll on both sides. Measured
//    on 2 ranks: a 16 MiB all-reduce polled with 10 µs sleeps took 4-6× as long as a blocking
//    MPI_Allreduce, with 1 ms sleeps 22×; polled without sleeping, the same as blocking.
// So the loop polls eagerly (yielding the core between polls) while data is expected to be
// moving, and sleeps otherwise:
//  - eagerly for the first `eager_s` seconds (the caller's estimate of how long its transfer
//    takes once every rank is there) and again after every poll that reported progress;
//  - otherwise it sleeps between polls for 1/256 of the time since the last progress, at least
//    10 µs and at most 1 ms: a rank that has waited a quarter of a second for a peer that is still
//    computing polls once a millisecond (measured: a 1 s wait costs the waiter ~2-6% of a core),
//    and notices the peer's arrival at most 1 ms late, which is small against the wait itself.
#pragma once

#include <chrono>
#include <functional>

namespace llmtrain::parallel {

enum class Poll {
  done,        // the operation completed
  progressed,  // not complete, but part of it completed since the last poll
  pending,     // nothing new
};

inline constexpr double kMinEagerSeconds = 1e-3;
inline constexpr int kNapDivisor = 256;
inline constexpr auto kShortestNap = std::chrono::microseconds(10);
inline constexpr auto kLongestNap = std::chrono::microseconds(1000);

// Calls `poll` until it returns Poll::done or `timeout_s` seconds have passed. Returns the seconds
// waited, or -1 when the time ran out (the caller names what it waited for in its error).
// Exceptions from `poll` propagate.
double wait_poll(const std::function<Poll()>& poll, double timeout_s, double eager_s = kMinEagerSeconds);

// For a transfer of `bytes`: how long to poll eagerly (1 ms, plus the bytes at 1 GB/s).
inline double eager_seconds_for(double bytes) { return kMinEagerSeconds + bytes / 1e9; }

}  // namespace llmtrain::parallel
