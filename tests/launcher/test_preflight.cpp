// The launcher's pre-flight checks that reach the file system (launcher/preflight.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "common/error.h"
#include "launcher/child_process.h"
#include "launcher/preflight.h"

using namespace llmtrain::launcher;
namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Issue 33: the write test wrote `.llmtrain-write-test.<pid>`, a predictable name, with O_TRUNC and
// following links: a link planted in a shared folder turned it into a write to another file (and
// its unlink then removed the link, not ours).
TEST(Preflight, WriteTestNeverWritesThroughALink) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("preflight_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "victim") << "precious";
  for (int pid = ::getpid() - 2; pid <= ::getpid() + 2; ++pid)
    fs::create_symlink(dir / "victim", dir / (".llmtrain-write-test." + std::to_string(pid)));
  check_writable_dir(dir.string(), "log.dir");
  EXPECT_EQ(slurp(dir / "victim"), "precious");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}), 1 + 5);  // its probe is gone
  fs::remove_all(dir);
}

// Inside an allocation with fewer GPUs per node than ranks, srun's --gpus-per-task=1 would wait
// forever: refused before it starts, naming both counts, unless the ranks may share the GPUs.
TEST(Preflight, SlurmGpusFewerThanRanksPerNodeAreRefusedUnlessShared) {
  if (find_program("srun").empty()) GTEST_SKIP() << "srun is not installed";
  const fs::path dir = fs::path(::testing::TempDir()) / ("preflight_gpus_" + std::to_string(::getpid()));
  llmtrain::Recipe r;
  r.train.device = llmtrain::DeviceKind::cuda;
  r.launch.procs_per_node = 4;
  r.log.dir = (dir / "log").string();
  r.checkpoint.dir = (dir / "ckpt").string();
  LaunchPlan plan;
  plan.mode = LaunchMode::slurm_srun;
  plan.world_size = plan.ranks_per_node = 4;
  plan.command = {"srun"};
  const std::vector<std::pair<const char*, const char*>> vars = {{"SLURM_JOB_ID", "9"},
                                                                 {"SLURM_JOB_NUM_NODES", "1"},
                                                                 {"SLURM_NTASKS", "4"},
                                                                 {"SLURM_JOB_CPUS_PER_NODE", "8"},
                                                                 {"SLURM_GPUS_ON_NODE", "2"}};
  for (const auto& [k, v] : vars) setenv(k, v, 1);
  try {
    preflight_check(r, plan);
    ADD_FAILURE() << "4 ranks per node on 2 GPUs";
  } catch (const llmtrain::Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.device is cuda with 4 ranks per node, but Slurm job 9 has 2 GPU(s) "
                                         "per node (SLURM_GPUS_ON_NODE=2)"),
              std::string::npos)
        << e.what();
    EXPECT_NE(e.hint().find("launch.share_devices: true"), std::string::npos) << e.hint();
  }
  EXPECT_FALSE(fs::exists(dir));  // refused before the run's folders are made
  r.launch.share_devices = true;
  EXPECT_NO_THROW(preflight_check(r, plan));
  for (const auto& [k, v] : vars) unsetenv(k);
  fs::remove_all(dir);
}

}  // namespace

// A CPU job's threads against the cores: quiet when they fit, the counts and the way out otherwise.
TEST(Preflight, OversubscriptionIsWarnedWithTheCounts) {
  EXPECT_EQ(oversubscription_warning(2, 1, 2, 0), "");
  EXPECT_EQ(oversubscription_warning(1, 2, 2, -1), "");  // load unknown
  const std::string over = oversubscription_warning(2, 2, 2, 0);
  EXPECT_NE(over.find("2 rank(s) × 2 thread(s) = 4 compute thread(s) on 2 usable core(s)"), std::string::npos) << over;
  EXPECT_NE(over.find("fewer ranks or --set train.threads=N"), std::string::npos) << over;
  const std::string loaded = oversubscription_warning(1, 2, 2, 3);
  EXPECT_NE(loaded.find("and 3 other runnable thread(s) right now (/proc/loadavg)"), std::string::npos) << loaded;
  EXPECT_NE(loaded.find("--set train.threads=1 often holds up best"), std::string::npos) << loaded;
}
