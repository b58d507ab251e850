// The rank side of stopping a job (docs/launching.md "Signals"): neither launcher program passes
// SIGTERM on to the ranks — Open MPI's mpirun answers it by killing every rank a second later, and
// Slurm's srun by SIGKILLing the step — but both forward SIGUSR1 to every rank on every host. So
// the supervisor sends SIGUSR1 to mpirun/srun, and each rank turns it into a SIGTERM to itself,
// which the trainer's stop handler (common/signals.h) answers with a checkpoint and exit 75.
//
// Rule a reader could get wrong: a rank must see one SIGTERM per stop — the trainer exits at once,
// without a checkpoint, on a second one. So the relay sends SIGTERM at most once, and not at all
// when a stop was already requested (Slurm may have signalled the rank directly).
#pragma once

#include <csignal>

namespace llmtrain::launcher {

inline constexpr int kStopRelaySignal = SIGUSR1;

// Installs the SIGUSR1 -> SIGTERM relay in this process (a rank). Idempotent.
void install_stop_relay();

}  // namespace llmtrain::launcher
