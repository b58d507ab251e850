#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "common/error.h"
#include "launcher/sbatch_script.h"

using namespace llmtrain;
using namespace llmtrain::launcher;
using ::testing::HasSubstr;
using ::testing::Not;

namespace {

Recipe recipe() {
  Recipe r;
  r.name = "gpt";
  r.log.dir = "/runs/gpt";
  r.launch.procs_per_node = 4;
  return r;
}

SbatchRequest request() {
  SbatchRequest q;
  q.llmtrain = "/opt/llmtrain/bin/llmtrain";
  q.recipe = "/home/u/gpt.yaml";
  q.workdir = "/home/u";
  q.overrides = {"train.steps=100", "log.every=5"};
  q.nodes = 2;
  q.version = "0.1.0";
  return q;
}

}  // namespace

TEST(SbatchScript, CpuJobTakesWholeNodesAndRequeuesOnInterruption) {
  std::string s = sbatch_script(recipe(), request());
  EXPECT_THAT(s, HasSubstr("#!/bin/bash\n"));
  EXPECT_THAT(s, HasSubstr("#SBATCH --job-name=llmtrain-gpt\n"));
  EXPECT_THAT(s, HasSubstr("#SBATCH --nodes=2\n"));
  EXPECT_THAT(s, HasSubstr("#SBATCH --ntasks-per-node=4\n"));
  EXPECT_THAT(s, HasSubstr("#SBATCH --exclusive"));
  EXPECT_THAT(s, Not(HasSubstr("--gpus-per-node")));
  EXPECT_THAT(s, Not(HasSubstr("--time")));
  EXPECT_THAT(s, HasSubstr("#SBATCH --signal=TERM@300 "));
  EXPECT_THAT(s, HasSubstr("#SBATCH --requeue\n"));
  EXPECT_THAT(s, HasSubstr("#SBATCH --open-mode=append"));
  EXPECT_THAT(s, HasSubstr("#SBATCH --output=/runs/gpt/slurm-%j.out\n"));
  EXPECT_THAT(s, HasSubstr("#SBATCH --chdir=/home/u\n"));
  EXPECT_THAT(s, HasSubstr("/opt/llmtrain/bin/llmtrain run /home/u/gpt.yaml \\\n    --set train.steps=100 \\\n    "
                           "--set log.every=5 \\\n    --set launch.nodes=2 &\nchild=$!\n"));
  EXPECT_THAT(s, HasSubstr("trap '"));
  EXPECT_THAT(s, HasSubstr("if ((status == 75)); then"));
  EXPECT_THAT(s, HasSubstr("scontrol requeue \"$SLURM_JOB_ID\""));
  EXPECT_THAT(s, HasSubstr("exit \"$status\"\n"));
}

TEST(SbatchScript, GpuJobAsksOneGpuPerRankAndHonoursFlagsOverTheRecipe) {
  Recipe r = recipe();
  r.train.device = DeviceKind::cuda;
  r.train.threads = 6;
  r.launch.slurm.time = "01:00:00";
  r.launch.slurm.partition = "gpu";
  r.launch.slurm.account = "proj";
  SbatchRequest q = request();
  q.time = "2-00:00:00";
  q.signal_margin_s = 600;
  q.rank_command = {"/usr/bin/nvidia-smi", "-L"};
  std::string s = sbatch_script(r, q);
  EXPECT_THAT(s, HasSubstr("#SBATCH --gpus-per-node=4    # srun gives each rank one of them (--gpus-per-task=1)\n"));
  EXPECT_THAT(s, HasSubstr("#SBATCH --cpus-per-task=6\n"));
  EXPECT_THAT(s, Not(HasSubstr("--exclusive")));
  EXPECT_THAT(s, HasSubstr("#SBATCH --time=2-00:00:00\n"));
  EXPECT_THAT(s, HasSubstr("#SBATCH --partition=gpu\n"));
  EXPECT_THAT(s, HasSubstr("#SBATCH --account=proj\n"));
  EXPECT_THAT(s, HasSubstr("#SBATCH --signal=TERM@600 "));
  EXPECT_THAT(s, HasSubstr("--set launch.nodes=2 \\\n    -- /usr/bin/nvidia-smi -L &\n"));
}

TEST(SbatchScript, RefusesWhatCannotWork) {
  Recipe r = recipe();
  r.train.device = DeviceKind::cuda;
  SbatchRequest q = request();
  q.gpus_per_node = 2;
  try {
    sbatch_script(r, q);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("launch.procs_per_node 4 ranks per node, but --gpus-per-node is 2"));
  }
  try {
    sbatch_script(r, q);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.hint(), HasSubstr("launch.share_devices: true"));
  }
  q.gpus_per_node = 0;
  r.launch.share_devices = true;  // sharing still needs a GPU
  EXPECT_THROW(sbatch_script(r, q), Error);
  r = recipe();
  r.launch.hostfile = "/hosts";
  EXPECT_THROW(sbatch_script(r, request()), Error);
}

// launch.share_devices: fewer GPUs per node than ranks is what the user asked for (one GPU testing
// multi-rank code), and the header says how the ranks use them.
TEST(SbatchScript, SharedDevicesAllowFewerGpusThanRanks) {
  Recipe r = recipe();
  r.train.device = DeviceKind::cuda;
  r.launch.share_devices = true;
  SbatchRequest q = request();
  q.gpus_per_node = 1;
  std::string s = sbatch_script(r, q);
  EXPECT_THAT(s,
              HasSubstr("#SBATCH --gpus-per-node=1    # launch.share_devices: each rank takes GPU local_rank mod 1\n"));
  EXPECT_THAT(s, HasSubstr("#SBATCH --ntasks-per-node=4\n"));
  q.gpus_per_node = -1;  // not given: one per rank, shared by srun's ranks all the same
  EXPECT_THAT(sbatch_script(r, q), HasSubstr("#SBATCH --gpus-per-node=4    # srun gives the ranks of a node"));
}

TEST(SbatchScript, ValuesThatWouldEndAnSbatchLineAreRefused) {
  // "#SBATCH --partition=gpu" + a line break + "rm -rf ~": the second line would run on the node.
  for (auto set : std::vector<std::function<void(Recipe&, SbatchRequest&)>>{
           [](Recipe&, SbatchRequest&q) { q.partition = "gpu\nrm -rf ~"; },
           [](Recipe&, SbatchRequest&q) { q.account = "acct\r\nid"; },
           [](Recipe&, SbatchRequest&q) { q.time = "1:00:00\nid"; },
           [](Recipe&, SbatchRequest&q) { q.recipe = "/tmp/x\nid\n.yaml"; },
           [](Recipe&, SbatchRequest&q) { q.workdir = "/tmp/w\nid"; },
           [](Recipe&r, SbatchRequest&) { r.launch.slurm.partition = "gpu\nid"; },
           [](Recipe&r, SbatchRequest&) { r.log.dir = "runs/x\nid"; },
       }) {
    Recipe r = recipe();
    SbatchRequest q = request();
    set(r, q);
    try {
      sbatch_script(r, q);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("cannot be written into an sbatch script"));
    }
  }
}

TEST(SbatchScript, NodesDefaultToTheRecipesLaunchNodes) {
  Recipe r = recipe();
  r.launch.nodes = 8;
  SbatchRequest q = request();
  q.nodes = 0;  // --nodes not given
  std::string s = sbatch_script(r, q);
  EXPECT_THAT(s, HasSubstr("# 8 nodes × 4 ranks = 32 ranks"));
  EXPECT_THAT(s, HasSubstr("#SBATCH --nodes=8\n"));
  EXPECT_THAT(s, HasSubstr("--set launch.nodes=8 &\n"));
  q.nodes = 2;  // --nodes wins over the recipe
  EXPECT_THAT(sbatch_script(r, q), HasSubstr("#SBATCH --nodes=2\n"));
}
