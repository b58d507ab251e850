#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "common/error.h"
#include "launcher/launch_plan.h"

using namespace llmtrain;
using namespace llmtrain::launcher;
using ::testing::HasSubstr;
using ::testing::Not;

namespace {

Recipe recipe(int procs_per_node, int nodes = 1) {
  Recipe r;
  r.name = "t";
  r.launch.procs_per_node = procs_per_node;
  r.launch.nodes = nodes;
  r.parallel.dp = procs_per_node * nodes;
  return r;
}

PlanInputs machine(int cores, bool root = false) {
  PlanInputs in;
  in.cores = cores;
  in.root = root;
  return in;
}

const std::vector<std::string> kArgv{"/bin/llmtrain", "run", "/r.yaml"};

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : " ") + s;
  return out;
}

std::string write_hostfile(const std::string& text) {
  std::string path = ::testing::TempDir() + "hosts_" + std::to_string(getpid());
  std::ofstream(path) << text;
  return path;
}

}  // namespace

TEST(LaunchPlan, OneRankTrainsInProcess) {
  LaunchPlan p = plan_launch(recipe(1), machine(8), kArgv);
  EXPECT_EQ(p.mode, LaunchMode::in_process);
  EXPECT_TRUE(p.command.empty());
  EXPECT_FALSE(p.spawns());
  EXPECT_EQ(p.threads_per_rank, 8);
}

TEST(LaunchPlan, OneRankGoesThroughMpirunWhenItMayBeRestartedOrRunsAProgram) {
  Recipe r = recipe(1);
  r.launch.max_restarts = 2;
  LaunchPlan p = plan_launch(r, machine(8), kArgv);
  EXPECT_EQ(p.mode, LaunchMode::local_mpirun);
  EXPECT_THAT(joined(p.command), HasSubstr("mpirun -np 1 --bind-to none --tag-output"));
  EXPECT_THAT(joined(p.notes), HasSubstr("so that the launcher can restart it (launch.max_restarts 2)"));
  PlanInputs in = machine(8);
  in.rank_program = true;
  EXPECT_EQ(plan_launch(recipe(1), in, {"/bin/hostname"}).mode, LaunchMode::local_mpirun);
}

TEST(LaunchPlan, LocalOversubscribedRanksAreNotBound) {
  LaunchPlan p = plan_launch(recipe(4), machine(2, /*root=*/true), kArgv);
  EXPECT_EQ(p.mode, LaunchMode::local_mpirun);
  EXPECT_EQ(joined(p.command),
            "mpirun -np 4 --oversubscribe --bind-to none --tag-output -x OMP_NUM_THREADS=1 -x LLMTRAIN_RESTART_COUNT "
            "-x LLMTRAIN_JOB -x LLMTRAIN_PROGRESS -x LLMTRAIN_FLIGHT_DIR "
            "/bin/llmtrain run /r.yaml");
  EXPECT_EQ(p.rank_argv, kArgv);
  EXPECT_EQ(p.env_line(), "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1");
  EXPECT_THAT(joined(p.notes), HasSubstr("4 ranks on 2 cores: oversubscribed, binding off"));
}

TEST(LaunchPlan, LocalThreadsPerRankAreCoresOverRanks) {
  LaunchPlan p = plan_launch(recipe(2), machine(16), kArgv);
  EXPECT_EQ(p.threads_per_rank, 8);
  EXPECT_THAT(joined(p.command), HasSubstr("mpirun -np 2 --bind-to none --tag-output -x OMP_NUM_THREADS=8"));
  EXPECT_TRUE(p.env.empty());  // not root, CMA works
  // One thread per rank and a core each: Open MPI's default binding (a core per rank) stays.
  p = plan_launch(recipe(8), machine(8), kArgv);
  EXPECT_THAT(joined(p.command), HasSubstr("mpirun -np 8 --tag-output -x OMP_NUM_THREADS=1"));
  Recipe r = recipe(2);
  r.train.threads = 3;
  EXPECT_THAT(joined(plan_launch(r, machine(16), kArgv).command), HasSubstr("OMP_NUM_THREADS=3"));
}

TEST(LaunchPlan, BlockedCrossMemoryAttachSwitchesOpenMpiToCopies) {
  PlanInputs in = machine(4);
  in.cma_available = false;
  LaunchPlan p = plan_launch(recipe(2), in, kArgv);
  EXPECT_EQ(p.env_line(), "OMPI_MCA_btl_vader_single_copy_mechanism=none");
}

TEST(LaunchPlan, SeveralNodesOutsideSlurmAreBlocked) {
  LaunchPlan p = plan_launch(recipe(2, 2), machine(4), kArgv);
  EXPECT_THAT(p.blocker, HasSubstr("launch.nodes is 2 but this is one host, outside any Slurm allocation"));
  EXPECT_THAT(p.blocker_hint, HasSubstr("llmtrain sbatch"));
}

TEST(LaunchPlan, InsideSlurmRanksStartWithSrunOverTheAllocation) {
  PlanInputs in = machine(2);
  in.env.slurm_job_id = "42";
  in.slurm.job_id = "42";
  in.slurm.nodes = 2;
  in.slurm.cpus_per_node = {16, 16};
  LaunchPlan p = plan_launch(recipe(4, 2), in, kArgv);
  EXPECT_EQ(p.mode, LaunchMode::slurm_srun);
  EXPECT_EQ(joined(p.command),
            "srun --mpi=pmix --nodes=2 --ntasks=8 --ntasks-per-node=4 --cpus-per-task=4 --kill-on-bad-exit=1 --label "
            "/bin/llmtrain run /r.yaml");
  EXPECT_EQ(p.env_line(), "OMP_NUM_THREADS=4");
  in.slurm.cpus_per_task = 3;  // sbatch --cpus-per-task wins over the node's CPUs
  EXPECT_THAT(joined(plan_launch(recipe(4, 2), in, kArgv).command), HasSubstr("--cpus-per-task=3"));
  // One rank inside Slurm is still a step: Slurm's --signal reaches steps, not the batch shell.
  EXPECT_EQ(plan_launch(recipe(1), in, kArgv).mode, LaunchMode::slurm_srun);
  Recipe r = recipe(4, 2);
  r.launch.hostfile = "/h";
  EXPECT_THAT(plan_launch(r, in, kArgv).blocker, HasSubstr("launch.hostfile is set (/h), but this runs inside Slurm"));
}

TEST(LaunchPlan, HostfileRunsMpirunOverSshWithTheRecipesOptions) {
  std::string hosts = write_hostfile("n1 slots=2\nn2 slots=2\n");
  Recipe r = recipe(2);
  r.parallel.dp = 4;
  r.launch.hostfile = hosts;
  r.launch.ssh.port = 2200;
  r.launch.ssh.identity = "/keys/id";
  r.launch.ssh.config = "/etc/cfg";
  LaunchPlan p = plan_launch(r, machine(8), kArgv);
  EXPECT_EQ(p.mode, LaunchMode::ssh_mpirun);
  EXPECT_EQ(p.nodes, 2);
  ASSERT_EQ(p.hosts.size(), 2u);
  EXPECT_EQ(p.command_line(),
            "mpirun -np 4 --hostfile " + hosts +
                " --map-by ppr:2:node --bind-to none --mca plm_rsh_agent 'ssh -o BatchMode=yes -p 2200 -i /keys/id -F "
                "/etc/cfg' --tag-output -x OMP_NUM_THREADS=4 -x LLMTRAIN_RESTART_COUNT -x LLMTRAIN_JOB -x "
                "LLMTRAIN_PROGRESS -x LLMTRAIN_FLIGHT_DIR /bin/llmtrain "
                "run /r.yaml");
  EXPECT_EQ(joined(p.command_with({"--set", "x=1"})), joined(p.command) + " --set x=1");
}

TEST(LaunchPlan, WorldWithAHostfileIsHostsTimesProcsPerNode) {
  Recipe r = recipe(2);
  r.launch.hostfile = write_hostfile("a\nb\nc\n");
  WorldInfo w = planned_world(r, parallel::LaunchEnv{});
  EXPECT_EQ(w.size, 6);
  EXPECT_EQ(w.source, "3 hosts in launch.hostfile × launch.procs_per_node 2");
  r.launch.hostfile = write_hostfile("a slot=1\n");
  EXPECT_THROW(planned_world(r, parallel::LaunchEnv{}), Error);
  // A rank takes its world from its launcher, and never reads the hostfile.
  parallel::LaunchEnv rank;
  rank.launcher = parallel::Launcher::mpirun;
  rank.world_size = 5;
  EXPECT_EQ(planned_world(r, rank).size, 5);
}

TEST(LaunchPlan, ARankStartsNothing) {
  PlanInputs in = machine(8);
  in.env.launcher = parallel::Launcher::mpirun;
  in.env.world_size = 4;
  in.env.local_size = 4;
  LaunchPlan p = plan_launch(recipe(4), in, kArgv);
  EXPECT_EQ(p.mode, LaunchMode::as_rank);
  EXPECT_TRUE(p.command.empty());
  EXPECT_EQ(p.threads_per_rank, 2);
  in.rank_program = true;
  EXPECT_THAT(plan_launch(recipe(4), in, kArgv).blocker, HasSubstr("this process is already a rank"));
}

// train.device cuda inside an allocation with GPUs: one GPU per task, bound, so each rank sees its
// own as device 0; with launch.share_devices or no GPUs Slurm knows of, srun asks for none.
TEST(LaunchPlan, SrunAsksOneGpuPerTaskForCuda) {
  PlanInputs in = machine(2);
  in.env.slurm_job_id = "42";
  in.slurm.job_id = "42";
  in.slurm.nodes = 2;
  in.slurm.cpus_per_node = {16, 16};
  in.slurm.gpus_per_node = 4;
  in.slurm.gpus_source = "SLURM_GPUS_ON_NODE=4";
  Recipe r = recipe(4, 2);
  r.train.device = DeviceKind::cuda;
  LaunchPlan p = plan_launch(r, in, kArgv);
  EXPECT_EQ(joined(p.command),
            "srun --mpi=pmix --nodes=2 --ntasks=8 --ntasks-per-node=4 --cpus-per-task=4 --kill-on-bad-exit=1 --label "
            "--gpus-per-task=1 --gpu-bind=per_task:1 /bin/llmtrain run /r.yaml");
  EXPECT_THAT(joined(p.notes), HasSubstr("(SLURM_GPUS_ON_NODE=4) per rank, bound to it"));

  r.launch.share_devices = true;
  p = plan_launch(r, in, kArgv);
  EXPECT_THAT(joined(p.command), Not(HasSubstr("--gpus-per-task")));
  EXPECT_THAT(joined(p.notes), HasSubstr("launch.share_devices: srun asks for no GPU per task"));

  r.launch.share_devices = false;
  in.slurm.gpus_per_node = 0;
  p = plan_launch(r, in, kArgv);
  EXPECT_THAT(joined(p.command), Not(HasSubstr("--gpu")));
  EXPECT_THAT(joined(p.notes), HasSubstr("the allocation holds no GPUs Slurm manages"));

  in.slurm.gpus_per_node = 4;  // a CPU run asks for no GPU
  EXPECT_THAT(joined(plan_launch(recipe(4, 2), in, kArgv).command), Not(HasSubstr("--gpu")));
}

// Open MPI copies its environment only to the ranks of its own host: device and NCCL settings go
// to every rank by name (never by value on the command line).
TEST(LaunchPlan, MpirunPassesDeviceAndNcclVariablesOnByName) {
  const char* environ_entries[] = {
      "PATH=/bin", "NCCL_DEBUG=INFO", "CUDA_VISIBLE_DEVICES=2,3", "NCCL_SOCKET_IFNAME=eth0;rm -rf ~",
      "NCCLX=1",   "NCCL_BAD-NAME=1", "LLMTRAIN_SIM_DEVICES=2",   "NCCL_DEBUG=again",
      nullptr};
  const std::vector<std::string> names = forwarded_env_names(environ_entries);
  EXPECT_EQ(names, (std::vector<std::string>{"CUDA_VISIBLE_DEVICES", "LLMTRAIN_SIM_DEVICES", "NCCL_DEBUG",
                                             "NCCL_SOCKET_IFNAME"}));
  PlanInputs in = machine(8);
  in.forwarded_env = names;
  const std::string local = plan_launch(recipe(2), in, kArgv).command_line();
  EXPECT_THAT(local, HasSubstr("-x LLMTRAIN_FLIGHT_DIR -x CUDA_VISIBLE_DEVICES -x LLMTRAIN_SIM_DEVICES -x NCCL_DEBUG "
                               "-x NCCL_SOCKET_IFNAME /bin/llmtrain run"));
  EXPECT_THAT(local, Not(HasSubstr("eth0")));
  std::string hosts = write_hostfile("n1 slots=2\nn2 slots=2\n");
  Recipe r = recipe(2);
  r.parallel.dp = 4;
  r.launch.hostfile = hosts;
  EXPECT_THAT(plan_launch(r, in, kArgv).command_line(), HasSubstr("-x CUDA_VISIBLE_DEVICES -x LLMTRAIN_SIM_DEVICES"));
  std::remove(hosts.c_str());
}
