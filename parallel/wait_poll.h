// The one polling loop behind every bounded wait on another rank (Comm waits, bootstrap steps).
//
// Rule a reader could get wrong: a waiting rank must not burn a core. On a machine with fewer
// cores than ranks (CI: 4 ranks on 2 cores) a spinning waiter steals the time the rank it waits
// for needs. So the loop yields for the first ~100 polls (cheap when the answer comes quickly,
// as for small collectives), then sleeps 20 µs, doubling up to 1 ms between polls.
#pragma once

#include <functional>

namespace llmtrain::parallel {

// Calls `done` until it returns true or `timeout_s` seconds have passed. Returns the seconds
// waited, or -1 when the time ran out (the caller names what it waited for in its error).
// Exceptions from `done` propagate.
double wait_poll(const std::function<bool()>& done, double timeout_s);

}  // namespace llmtrain::parallel
