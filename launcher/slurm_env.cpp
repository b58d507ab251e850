#include "launcher/slurm_env.h"

#include <algorithm>
#include <cstdlib>

#include "common/strings.h"

namespace llmtrain::launcher {
namespace {

std::string env_str(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

int to_int(std::string_view s, int fallback) {
  if (s.empty()) return fallback;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return fallback;
    v = v * 10 + (c - '0');
    if (v > 100000000) return fallback;
  }
  return v;
}

int env_int(const char* name, int fallback) { return to_int(env_str(name), fallback); }

}  // namespace

std::vector<int> parse_slurm_counts(std::string_view text) {
  std::vector<int> out;
  if (text.empty()) return out;
  for (const std::string& part : split(text, ',')) {
    std::string_view p = part;
    int repeat = 1;
    if (auto open = p.find("(x"); open != std::string_view::npos) {
      if (p.back() != ')') return {};
      repeat = to_int(p.substr(open + 2, p.size() - open - 3), -1);
      p = p.substr(0, open);
    }
    int count = to_int(p, -1);
    if (count < 0 || repeat < 1) return {};
    out.insert(out.end(), static_cast<size_t>(repeat), count);
  }
  return out;
}

int SlurmAllocation::min_cpus_per_node() const {
  if (cpus_per_node.empty()) return 0;
  return *std::min_element(cpus_per_node.begin(), cpus_per_node.end());
}

SlurmAllocation slurm_allocation_from_env() {
  SlurmAllocation a;
  a.job_id = env_str("SLURM_JOB_ID");
  if (a.job_id.empty()) return a;
  a.nodelist = env_str("SLURM_JOB_NODELIST");
  a.nodes = env_int("SLURM_JOB_NUM_NODES", env_int("SLURM_NNODES", 0));
  a.ntasks = env_int("SLURM_NTASKS", env_int("SLURM_NPROCS", 0));
  a.cpus_per_task = env_int("SLURM_CPUS_PER_TASK", 0);
  a.cpus_per_node = parse_slurm_counts(env_str("SLURM_JOB_CPUS_PER_NODE"));
  a.restart_count = env_int("SLURM_RESTART_COUNT", 0);
  return a;
}

}  // namespace llmtrain::launcher
