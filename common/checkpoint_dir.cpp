#include "common/checkpoint_dir.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "common/error.h"
#include "common/file_io.h"
#include "common/strings.h"

namespace llmtrain {
namespace fs = std::filesystem;

std::string checkpoint_step_dir(int64_t step) { return fmt::format("step_{:08}", step); }

int64_t checkpoint_parse_step_dir(const std::string& name) {
  if (name.size() < 13 || name.size() > 5 + 18 || name.rfind("step_", 0) != 0) return -1;  // no int64 overflow
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

namespace {

bool is_complete(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(path) / kManifestFile, ec);
}

}  // namespace

std::string checkpoint_latest(const std::string& dir) {
  if (dir.empty()) return "";
  std::string name;
  try {
    name = trim(read_file((fs::path(dir) / kLatestFile).string(), 4096));
  } catch (const Error&) {
    return "";  // missing, unreadable or not a small regular file: scan instead
  }
  if (checkpoint_parse_step_dir(name) < 0) return "";
  const std::string path = (fs::path(dir) / name).string();
  return is_complete(path) ? path : "";
}

std::vector<std::string> checkpoint_candidates(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    int64_t step = checkpoint_parse_step_dir(e.path().filename().string());
    if (step >= 0 && e.is_directory(ec)) steps.emplace_back(step, e.path().string());
  }
  std::sort(steps.rbegin(), steps.rend());
  const std::string latest = checkpoint_latest(dir);
  const int64_t latest_step = latest.empty() ? -1 : checkpoint_parse_step_dir(fs::path(latest).filename().string());
  std::vector<std::string> out;
  if (!latest.empty()) out.push_back(latest);
  for (auto& [step, path] : steps)
    if (latest.empty() || step < latest_step) out.push_back(path);
  return out;
}

std::string checkpoint_to_resume(const std::string& dir) {
  if (dir.empty()) return "";
  for (const std::string& path : checkpoint_candidates(dir))
    if (is_complete(path)) return path;
  return "";
}

}  // namespace llmtrain
