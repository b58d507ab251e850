// Mesh groups under mpirun: for every (tp, pp, dp) layout of the world (4 ranks: tp2×dp2,
// pp2×dp2, tp2×pp2, 4×1×1 ...), each group communicator holds exactly the ranks Mesh's rank
// arithmetic says, in that order, and collectives and point-to-point on it reach exactly them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>

#include "common/error.h"
#include "parallel/mesh_comms.h"
#include "tests/parallel/mpi_test_env.h"

namespace llmtrain::parallel {
namespace {

using kernels::host_tensor;

using kernels::DType;
using mpitest::world;

std::vector<MeshShape> layouts(int world_size) {
  std::vector<MeshShape> out;
  for (int tp = 1; tp <= world_size; ++tp)
    for (int pp = 1; tp * pp <= world_size; ++pp)
      if (world_size % (tp * pp) == 0) out.push_back({tp, pp, world_size / (tp * pp)});
  return out;
}

TEST(MeshComms, EveryLayoutGivesTheMeshGroups) {
  const int me = world().rank();
  for (const MeshShape& shape : layouts(world().size())) {
    SCOPED_TRACE(Mesh::describe(shape));
    Mesh mesh(shape, me);
    MeshComms comms = make_mesh_comms(mesh, make_mpi_world_comm(30.0));
    EXPECT_EQ(comms.world->name(), "world");
    EXPECT_EQ(comms.world->size(), world().size());
    EXPECT_EQ(comms.control.world->name(), "world control");
    EXPECT_EQ(comms.control.world->size(), world().size());
    EXPECT_EQ(comms.control.world->rank(), me);
    // The tensor groups (tp, pp, dp) and the host control groups (every kind) have the mesh's members.
    std::vector<std::pair<Comm*, std::string>> groups;
    for (GroupKind kind : {GroupKind::tp, GroupKind::pp, GroupKind::dp})
      groups.emplace_back(&comms.group(kind), group_kind_name(kind));
    for (GroupKind kind : {GroupKind::tp, GroupKind::pp, GroupKind::dp, GroupKind::model_parallel})
      groups.emplace_back(&comms.control.group(kind), fmt::format("{} control", group_kind_name(kind)));
    for (auto& [comm, name] : groups) {
      Comm& c = *comm;
      const GroupKind kind = name.starts_with("tp")   ? GroupKind::tp
                             : name.starts_with("pp") ? GroupKind::pp
                             : name.starts_with("dp") ? GroupKind::dp
                                                      : GroupKind::model_parallel;
      const std::vector<int> members = mesh.group(kind);
      EXPECT_EQ(c.name(), name);
      ASSERT_EQ(c.size(), static_cast<int>(members.size())) << group_kind_name(kind);
      EXPECT_EQ(c.rank(), mesh.index_in(kind)) << group_kind_name(kind);

      // all-gather of world ranks lists the members, in order.
      std::vector<int32_t> got(members.size());
      int32_t mine = me;
      c.all_gather(Tensor(&mine, DType::int32, {1}), Tensor(got.data(), DType::int32, {c.size()}));
      EXPECT_EQ(std::vector<int>(got.begin(), got.end()), members) << group_kind_name(kind);

      // all-reduce reaches exactly the members.
      int64_t sum = me;
      c.all_reduce(Tensor(&sum, DType::int64, {1}), ReduceOp::sum);
      EXPECT_EQ(sum, std::accumulate(members.begin(), members.end(), int64_t(0))) << group_kind_name(kind);

      // avg over the group of fp32 values.
      float x = static_cast<float>(me) * c.size();
      c.all_reduce(host_tensor(&x, {1}), ReduceOp::avg);
      EXPECT_EQ(x, static_cast<float>(std::accumulate(members.begin(), members.end(), 0)));
    }

    // Pipeline neighbours: stage s sends its world rank to stage s+1 on the pp group.
    Comm& pp = *comms.pp;
    if (pp.size() > 1) {
      int32_t out = me, in = -1;
      std::vector<WorkHandle> w;
      if (pp.rank() + 1 < pp.size()) w.push_back(pp.send_async(Tensor(&out, DType::int32, {1}), pp.rank() + 1, 3));
      if (pp.rank() > 0) w.push_back(pp.recv_async(Tensor(&in, DType::int32, {1}), pp.rank() - 1, 3));
      wait_all(w);
      if (pp.rank() > 0) {
        MeshCoord prev = mesh.coord();
        prev.pp -= 1;
        EXPECT_EQ(in, Mesh::rank_of(shape, prev));
      }
    }
  }
}

TEST(MeshComms, AWorldOfTheWrongSizeIsRefusedNamingTheFactors) {
  MeshShape shape{2, 1, world().size()};  // twice the world
  Mesh mesh(shape, world().rank());
  try {
    make_mesh_comms(mesh, make_mpi_world_comm(30.0));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr(Mesh::describe(shape)));
    EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr(fmt::format("has {} ranks", world().size())));
  }
}

}  // namespace
}  // namespace llmtrain::parallel
