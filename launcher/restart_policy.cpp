#include "launcher/restart_policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "common/error.h"
#include "trainer/checkpoint_format.h"

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

const char* to_string(JobOutcome o) {
  switch (o) {
    case JobOutcome::finished:
      return "finished";
    case JobOutcome::user_error:
      return "user error";
    case JobOutcome::interrupted:
      return "interrupted";
    case JobOutcome::failed:
      return "failed";
  }
  return "?";
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

namespace {

bool complete(const fs::path& step_dir) {
  std::error_code ec;
  return fs::is_directory(step_dir, ec) && fs::is_regular_file(step_dir / trainer::kManifestFile, ec);
}

}  // namespace

std::string latest_complete_checkpoint(const std::string& dir) {
  // `latest` is replaced last (docs/checkpoint-format.md), so after a crash between the rename of
  // a step directory and that replacement, the newest complete directory is newer than `latest`:
  // the scan finds it either way.
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return "";
  int64_t best_step = -1;
  std::string best;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    int64_t step = trainer::checkpoint_parse_step_dir(entry.path().filename().string());
    if (step > best_step && complete(entry.path())) best_step = step, best = entry.path().string();
  }
  return best;
}

std::vector<std::string> resume_overrides() {
  return {"--set", "checkpoint.resume=auto", "--set", "checkpoint.load_weights_only=false"};
}

}  // namespace llmtrain::launcher
