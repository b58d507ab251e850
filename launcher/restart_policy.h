// What a job's exit status means to the supervisor, and how a failed job comes back (docs/architecture.md
// §4; docs/launching.md "Exit codes and restarts"):
//
//   0   finished                      -> done
//   2   user error (recipe, data)     -> no restart: the same input fails the same way
//   75  interrupted, checkpoint taken -> no restart here; the caller (or Slurm's requeue) resumes
//   any other status (a rank crashed, was killed, lost its peers, exited nonzero)
//       -> restart the whole job, from the newest complete checkpoint, after a back-off
//
// Rule a reader could get wrong: a restart resumes from the run's own newest checkpoint even when
// the recipe says otherwise (resume: none, or a fine-tuning run's resume path with
// load_weights_only): the overrides below are appended to every rank's arguments, and only when a
// complete checkpoint exists — with none, the restart starts over exactly as the first attempt did.
#pragma once

#include <string>
#include <vector>

namespace llmtrain::launcher {

enum class JobOutcome { finished, user_error, interrupted, failed };

JobOutcome classify_exit(int status);
// What `llmtrain run` itself exits with when a job it supervised ends for good with `status`: 0, 2
// and 75 as they are; any failure 1 (as torchrun's), whatever the ranks' statuses were. A status of
// 128 + N would read as if the launcher itself had been killed by signal N (a crashed rank is
// named in the launcher's message instead).
int launcher_exit_status(int status);
const char* to_string(JobOutcome outcome);

// "exit 137 (killed by signal 9, Killed)", "exit 3".
std::string describe_exit(int status);

// Seconds to wait before restart number `restart` (1-based): base × 2^(restart-1), at most cap.
double restart_backoff_s(int restart, double base_s, double cap_s);

// The rank arguments a restart appends when a complete checkpoint exists.
std::vector<std::string> resume_overrides();

}  // namespace llmtrain::launcher
