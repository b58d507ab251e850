#include "common/checkpoint_dir.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

namespace llmtrain {
namespace fs = std::filesystem;

std::string checkpoint_step_dir(int64_t step) { return fmt::format("step_{:08}", step); }

int64_t checkpoint_parse_step_dir(const std::string& name) {
  if (name.size() < 13 || name.rfind("step_", 0) != 0) return -1;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

std::vector<std::string> checkpoint_candidates(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    int64_t step = checkpoint_parse_step_dir(e.path().filename().string());
    if (step >= 0 && e.is_directory(ec)) steps.emplace_back(step, e.path().string());
  }
  std::sort(steps.rbegin(), steps.rend());
  std::vector<std::string> out;
  for (auto& [step, path] : steps) out.push_back(path);
  return out;
}

std::string checkpoint_newest_complete(const std::string& dir) {
  if (dir.empty()) return "";
  std::error_code ec;
  for (const std::string& path : checkpoint_candidates(dir))
    if (fs::is_regular_file(fs::path(path) / kManifestFile, ec)) return path;
  return "";
}

}  // namespace llmtrain
