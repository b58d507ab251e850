// Bootstrap under mpirun: the rank and world come from MPI and agree with mpirun's environment,
// torchrun's variables are exported, MPI runs at (at least) the thread level we asked for, and the
// node facts are those of one host.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <string>

#include "tests/parallel/mpi_test_env.h"

namespace llmtrain::parallel {
namespace {

using mpitest::runtime;
using mpitest::world;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "<unset>";
}

TEST(BootstrapMpi, RankAndWorldComeFromTheLauncher) {
  const RankInfo& info = runtime().info();
  EXPECT_EQ(info.launcher, Launcher::mpirun);
  EXPECT_TRUE(info.mpi);
  EXPECT_EQ(std::to_string(info.rank), env("OMPI_COMM_WORLD_RANK"));
  EXPECT_EQ(std::to_string(info.world_size), env("OMPI_COMM_WORLD_SIZE"));
  EXPECT_EQ(info.rank, world().rank());
  EXPECT_EQ(info.world_size, world().size());
  int initialized = 0;
  MPI_Initialized(&initialized);
  EXPECT_TRUE(initialized);
}

TEST(BootstrapMpi, TorchrunVariablesAreExported) {
  const RankInfo& info = runtime().info();
  EXPECT_EQ(env("RANK"), std::to_string(info.rank));
  EXPECT_EQ(env("WORLD_SIZE"), std::to_string(info.world_size));
  EXPECT_EQ(env("LOCAL_RANK"), std::to_string(info.local_rank));
  EXPECT_EQ(env("LOCAL_WORLD_SIZE"), std::to_string(info.local_size));
}

TEST(BootstrapMpi, OneHostIsOneNode) {
  const RankInfo& info = runtime().info();
  // mpirun on this host: every rank is local, and the local rank is the world rank.
  EXPECT_EQ(info.local_size, info.world_size);
  EXPECT_EQ(info.local_rank, info.rank);
  EXPECT_EQ(std::to_string(info.local_rank), env("OMPI_COMM_WORLD_LOCAL_RANK"));
  EXPECT_EQ(info.node, 0);
  EXPECT_EQ(info.nodes, 1);
  EXPECT_FALSE(info.hostname.empty());
}

TEST(BootstrapMpi, ThreadLevelIsAtLeastFunneled) {
  int provided = -1;
  MPI_Query_thread(&provided);
  EXPECT_GE(provided, MPI_THREAD_FUNNELED);
  EXPECT_NE(runtime().info().mpi_thread_level, "");
  int is_main = 0;
  MPI_Is_thread_main(&is_main);
  EXPECT_TRUE(is_main);
  EXPECT_THAT(runtime().info().describe(), ::testing::HasSubstr("via mpirun"));
}

}  // namespace
}  // namespace llmtrain::parallel
