#include "launcher/restart_policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "common/enum_names.h"
#include "common/error.h"

namespace llmtrain::launcher {
namespace fs = std::filesystem;

JobOutcome classify_exit(int status) {
  switch (status) {
    case kExitOk:
      return JobOutcome::finished;
    case kExitUserError:
      return JobOutcome::user_error;
    case kExitInterrupted:
      return JobOutcome::interrupted;
    default:
      return JobOutcome::failed;
  }
}

int launcher_exit_status(int status) { return classify_exit(status) == JobOutcome::failed ? kExitFailure : status; }

const char* to_string(JobOutcome o) {
  static constexpr EnumName<JobOutcome> kNames[] = {{"finished", JobOutcome::finished},
                                                    {"user error", JobOutcome::user_error},
                                                    {"interrupted", JobOutcome::interrupted},
                                                    {"failed", JobOutcome::failed}};
  return enum_name(kNames, o);
}

std::string describe_exit(int status) {
  if (status > 128 && status < 128 + 65)
    return fmt::format("exit {} (killed by signal {}, {})", status, status - 128, strsignal(status - 128));
  switch (status) {
    case kExitOk:
      return "exit 0 (finished)";
    case kExitUserError:
      return "exit 2 (user error)";
    case kExitInterrupted:
      return "exit 75 (interrupted, checkpoint written)";
    default:
      return fmt::format("exit {}", status);
  }
}

double restart_backoff_s(int restart, double base_s, double cap_s) {
  if (restart < 1) return 0.0;
  return std::min(cap_s, base_s * std::ldexp(1.0, std::min(restart - 1, 30)));
}

std::vector<std::string> resume_overrides() {
  return {"--set", "checkpoint.resume=auto", "--set", "checkpoint.load_weights_only=false"};
}

}  // namespace llmtrain::launcher
