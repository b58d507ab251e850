#include "launcher/slurm_env.h"

#include <algorithm>
#include <cstdlib>
#include <string>

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

int slurm_gpus_per_node(const char* gpus_on_node, const char* job_gpus, const char* gpus_per_node,
                        std::string* source) {
  source->clear();
  if (gpus_on_node && *gpus_on_node) {
    const int n = to_int(gpus_on_node, 0);
    if (n > 0) {
      *source = std::string("SLURM_GPUS_ON_NODE=") + gpus_on_node;
      return n;
    }
  }
  if (job_gpus && *job_gpus) {  // "0,1,2,3": the ids of this node's GPUs
    *source = std::string("SLURM_JOB_GPUS=") + job_gpus;
    return static_cast<int>(split(job_gpus, ',').size());
  }
  if (gpus_per_node && *gpus_per_node) {  // "4" or "h100:4"
    std::string_view v = gpus_per_node;
    if (auto colon = v.rfind(':'); colon != std::string_view::npos) v = v.substr(colon + 1);
    const int n = to_int(v, 0);
    if (n > 0) {
      *source = std::string("SLURM_GPUS_PER_NODE=") + gpus_per_node;
      return n;
    }
  }
  return 0;
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
  a.gpus_per_node = slurm_gpus_per_node(std::getenv("SLURM_GPUS_ON_NODE"), std::getenv("SLURM_JOB_GPUS"),
                                        std::getenv("SLURM_GPUS_PER_NODE"), &a.gpus_source);
  return a;
}

}  // namespace llmtrain::launcher
