// Bootstrap without MPI: a process with no launcher is one rank, MPI is not initialised, torchrun's
// variables say rank 0 of 1, and its world and mesh groups are one-rank communicators. A plain
// srun without PMIx is refused with the fix. (Under mpirun: test_bootstrap_mpi.cpp.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>

#include "common/error.h"
#include "parallel/bootstrap.h"
#include "parallel/mesh_comms.h"

namespace llmtrain::parallel {
namespace {

TEST(Bootstrap, NoLauncherIsOneRankWithoutMpi) {
  LaunchEnv env;  // launcher none
  auto rt = bootstrap(env, {.timeout_s = 12.0});
  const RankInfo& info = rt->info();
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.local_size, 1);
  EXPECT_EQ(info.nodes, 1);
  EXPECT_FALSE(info.mpi);
  EXPECT_FALSE(info.hostname.empty());
  int initialized = 1;
  MPI_Initialized(&initialized);
  EXPECT_FALSE(initialized) << "MPI must not be initialised without a launcher";
  EXPECT_STREQ(std::getenv("RANK"), "0");
  EXPECT_STREQ(std::getenv("WORLD_SIZE"), "1");
  EXPECT_STREQ(std::getenv("LOCAL_RANK"), "0");
  EXPECT_STREQ(std::getenv("LOCAL_WORLD_SIZE"), "1");

  auto world = rt->take_world();
  EXPECT_EQ(world->size(), 1);
  EXPECT_EQ(world->name(), "world");
  EXPECT_DOUBLE_EQ(world->timeout(), 12.0);
  rt->finalize();
  MPI_Initialized(&initialized);
  EXPECT_FALSE(initialized);
}

TEST(Bootstrap, PlainSrunWithoutPmixIsRefusedWithTheFix) {
  LaunchEnv env;
  env.launcher = Launcher::srun_no_pmix;
  env.world_size = 4;
  try {
    bootstrap(env);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("srun without PMIx"));
    EXPECT_THAT(e.hint(), ::testing::HasSubstr("srun --mpi=pmix"));
    EXPECT_EQ(e.exit_code(), kExitUserError);
  }
}

TEST(Bootstrap, RankMainWithoutLauncherReturnsTheBodysStatusAndLetsErrorsThrough) {
  LaunchEnv env;
  EXPECT_EQ(rank_main(env, {}, [](Runtime& rt) { return rt.info().world_size == 1 ? 5 : 0; }), 5);
  EXPECT_THROW(rank_main(env, {}, [](Runtime&) -> int { throw Error("bad recipe"); }), Error);
}

TEST(MeshComms, OneRankWorldGivesOneRankGroups) {
  auto rt = bootstrap(LaunchEnv{}, {.timeout_s = 9.0});
  MeshComms comms = make_mesh_comms(Mesh({1, 1, 1}, 0), rt->take_world());
  for (GroupKind kind : {GroupKind::tp, GroupKind::pp, GroupKind::dp}) {
    EXPECT_EQ(comms.group(kind).size(), 1);
    EXPECT_EQ(comms.group(kind).name(), group_kind_name(kind));
    EXPECT_DOUBLE_EQ(comms.group(kind).timeout(), 9.0);
  }
  for (GroupKind kind : {GroupKind::tp, GroupKind::pp, GroupKind::dp, GroupKind::model_parallel}) {
    EXPECT_EQ(comms.control.group(kind).size(), 1);
    EXPECT_EQ(comms.control.group(kind).name(), std::string(group_kind_name(kind)) + " control");
  }
  EXPECT_EQ(comms.control.world->size(), 1);
  comms.set_timeout(3.0);
  EXPECT_DOUBLE_EQ(comms.dp->timeout(), 3.0);
  EXPECT_DOUBLE_EQ(comms.world->timeout(), 3.0);
  EXPECT_DOUBLE_EQ(comms.control.mp->timeout(), 3.0);
  EXPECT_DOUBLE_EQ(comms.control.world->timeout(), 3.0);
}

TEST(MeshComms, LayoutLargerThanTheWorldIsRefusedNamingEveryFactor) {
  try {
    make_mesh_comms(Mesh({2, 2, 1}, 0), make_local_comm());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("the job has 1 ranks but the layout needs tp 2 × pp 2 × dp 1 = 4"));
  }
}

}  // namespace
}  // namespace llmtrain::parallel
