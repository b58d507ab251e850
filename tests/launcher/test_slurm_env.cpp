#include <gtest/gtest.h>

#include <cstdlib>

#include "launcher/slurm_env.h"

using namespace llmtrain::launcher;

TEST(SlurmEnv, ExpandsCompressedCounts) {
  EXPECT_EQ(parse_slurm_counts("4"), (std::vector<int>{4}));
  EXPECT_EQ(parse_slurm_counts("4(x2),2"), (std::vector<int>{4, 4, 2}));
  EXPECT_EQ(parse_slurm_counts("72(x3)"), (std::vector<int>{72, 72, 72}));
  EXPECT_TRUE(parse_slurm_counts("").empty());
  EXPECT_TRUE(parse_slurm_counts("4(x").empty());
  EXPECT_TRUE(parse_slurm_counts("a").empty());
}

TEST(SlurmEnv, ReadsTheAllocation) {
  setenv("SLURM_JOB_ID", "77", 1);
  setenv("SLURM_JOB_NUM_NODES", "2", 1);
  setenv("SLURM_NTASKS", "8", 1);
  setenv("SLURM_JOB_CPUS_PER_NODE", "16,8", 1);
  setenv("SLURM_RESTART_COUNT", "3", 1);
  unsetenv("SLURM_CPUS_PER_TASK");
  SlurmAllocation a = slurm_allocation_from_env();
  EXPECT_TRUE(a.active());
  EXPECT_EQ(a.job_id, "77");
  EXPECT_EQ(a.nodes, 2);
  EXPECT_EQ(a.ntasks, 8);
  EXPECT_EQ(a.cpus_per_task, 0);
  EXPECT_EQ(a.min_cpus_per_node(), 8);
  EXPECT_EQ(a.restart_count, 3);
  for (const char* v :
       {"SLURM_JOB_ID", "SLURM_JOB_NUM_NODES", "SLURM_NTASKS", "SLURM_JOB_CPUS_PER_NODE", "SLURM_RESTART_COUNT"})
    unsetenv(v);
  EXPECT_FALSE(slurm_allocation_from_env().active());
}

// The allocation's GPUs per node decide whether srun asks for one per task (launch_plan.cpp).
TEST(SlurmEnv, ReadsTheAllocationsGpusPerNode) {
  std::string source;
  EXPECT_EQ(slurm_gpus_per_node("4", "0,1,2,3", "4", &source), 4);
  EXPECT_EQ(source, "SLURM_GPUS_ON_NODE=4");
  EXPECT_EQ(slurm_gpus_per_node(nullptr, "2,5", nullptr, &source), 2);
  EXPECT_EQ(source, "SLURM_JOB_GPUS=2,5");
  EXPECT_EQ(slurm_gpus_per_node(nullptr, nullptr, "h100:8", &source), 8);
  EXPECT_EQ(source, "SLURM_GPUS_PER_NODE=h100:8");
  EXPECT_EQ(slurm_gpus_per_node("", "", "", &source), 0);  // none Slurm knows of
  EXPECT_EQ(source, "");
  EXPECT_EQ(slurm_gpus_per_node("x", nullptr, "gpu:", &source), 0);
}
