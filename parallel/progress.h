// Progress reports: how a rank tells the supervisor that started it (launcher/supervisor.h) that
// it still makes progress, so that a hung job is found and ended (launch.hang_timeout) instead of
// holding its nodes until the scheduler's time limit.
//
// The supervisor asks for reports by setting LLMTRAIN_PROGRESS=<seconds> in the ranks'
// environment; each rank then prints, from a thread of its own, every <seconds>, one line on its
// stdout that the supervisor takes out of the output (launcher/rank_output.h):
//
//   @@llmtrain-progress step=<last finished step> phase=<start|train|eval|save|load|done>
//       beat=<micro-batches done> [op=<the communication operation in flight, from the flight recorder>]
//
// The line travels wherever the rank's output does (mpirun's tagged output from every host, srun's
// labels), so no shared file system is assumed. The supervisor counts progress as a change of
// step, phase or beat; a rank blocked in a collective keeps reporting, naming the collective.
//
// Also set by the supervisor: LLMTRAIN_FLIGHT_DIR (parallel/comm/flight_recorder.h). When the
// supervisor finds a hang it sends SIGUSR2 to the ranks (mpirun and srun forward it); the
// reporter thread then writes the rank's flight record and reports once more at once.
//
// Without LLMTRAIN_PROGRESS (a rank the user's own mpirun started, a one-process run) nothing is
// printed and set_progress() only stores two numbers.
#pragma once

#include <cstdint>

namespace llmtrain::parallel {

inline constexpr const char* kProgressEnv = "LLMTRAIN_PROGRESS";
inline constexpr const char* kProgressMarker = "@@llmtrain-progress ";

enum class Phase { start, train, eval, save, load, done };
const char* to_string(Phase phase);

// Records where this rank is: the last finished step and what it does now. Cheap (two atomics);
// call it at every step and phase change.
void set_progress(int64_t step, Phase phase);
// Counts one piece of work done inside a phase (a micro-batch's forward in training or in
// evaluation): progress too, so that one long step or a long evaluation is not taken for a hang.
// Reported as `beat=<count>`. One atomic increment.
void beat_progress();

// Starts the reporter thread when LLMTRAIN_PROGRESS asks for it (a no-op otherwise, and when it
// runs already); installs the SIGUSR2 handler. `rank` names the flight record file.
void start_progress_reporter(int rank);
// Stops it (before MPI is finalized).
void stop_progress_reporter();

}  // namespace llmtrain::parallel
