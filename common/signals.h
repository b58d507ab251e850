// SIGTERM and SIGINT during training (docs/architecture.md §4): the first one asks the loop to finish the
// current step, write a checkpoint and exit with status 75 (kExitInterrupted); a second one exits
// at once with 128 + the signal number, as an unhandled signal would.
//
// Rule a reader could get wrong: the handler only sets a flag (async-signal-safe); the loop polls
// stop_requested() between steps. With several ranks, the loop must agree on stopping (one rank's
// flag is all-reduced with max) so that every rank checkpoints the same step.
#pragma once

#include <csignal>

namespace llmtrain {

// Installs the handlers for SIGTERM and SIGINT (idempotent).
void install_stop_handlers();
// Restores the default dispositions.
void remove_stop_handlers();
// True once SIGTERM or SIGINT has arrived since install_stop_handlers().
bool stop_requested();
// The signal that asked to stop (0 when none).
int stop_signal();

// Installs `handler` for `sig` the way every handler of ours is installed: interrupted system calls
// restart (SA_RESTART) and no other signal is blocked while it runs. Returns the action it replaced.
struct sigaction install_signal_handler(int sig, void (*handler)(int));

}  // namespace llmtrain
