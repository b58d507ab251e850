// Mesh arithmetic for many shapes: the (pp, dp, tp) order with tp fastest, groups partition the
// world, and every group's members agree on the group.
#include <gtest/gtest.h>

#include <set>

#include "parallel/mesh.h"

using namespace llmtrain::parallel;

TEST(Mesh, TpVariesFastestThenDpThenPp) {
  MeshShape s{2, 2, 3};  // tp 2, pp 2, dp 3: 12 ranks
  EXPECT_EQ(Mesh::coord_of(s, 0), (MeshCoord{0, 0, 0}));
  EXPECT_EQ(Mesh::coord_of(s, 1), (MeshCoord{0, 0, 1}));
  EXPECT_EQ(Mesh::coord_of(s, 2), (MeshCoord{0, 1, 0}));
  EXPECT_EQ(Mesh::coord_of(s, 6), (MeshCoord{1, 0, 0}));
  EXPECT_EQ(Mesh::coord_of(s, 11), (MeshCoord{1, 2, 1}));
}

TEST(Mesh, MegatronExampleGroups) {
  // Megatron-LM's documented example: 16 ranks, tp 2, pp 4, dp 2.
  MeshShape s{2, 4, 2};
  auto tp = Mesh::all_groups(s, GroupKind::tp);
  auto dp = Mesh::all_groups(s, GroupKind::dp);
  auto pp = Mesh::all_groups(s, GroupKind::pp);
  EXPECT_EQ(tp.size(), 8u);
  EXPECT_EQ(tp[0], (std::vector<int>{0, 1}));
  EXPECT_EQ(tp[7], (std::vector<int>{14, 15}));
  EXPECT_EQ(dp.size(), 8u);
  EXPECT_EQ(dp[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(dp[1], (std::vector<int>{1, 3}));
  EXPECT_EQ(pp.size(), 4u);
  EXPECT_EQ(pp[0], (std::vector<int>{0, 4, 8, 12}));
  EXPECT_EQ(pp[3], (std::vector<int>{3, 7, 11, 15}));
  auto mp = Mesh::all_groups(s, GroupKind::model_parallel);
  EXPECT_EQ(mp.size(), 2u);
  EXPECT_EQ(mp[0], (std::vector<int>{0, 1, 4, 5, 8, 9, 12, 13}));
}

TEST(Mesh, GroupsPartitionTheWorldForManyShapes) {
  for (int tp : {1, 2, 3, 4, 8})
    for (int pp : {1, 2, 3, 4})
      for (int dp : {1, 2, 5}) {
        MeshShape s{tp, pp, dp};
        for (int r = 0; r < s.world(); ++r) EXPECT_EQ(Mesh::rank_of(s, Mesh::coord_of(s, r)), r);
        struct Expect {
          GroupKind kind;
          int size;
        };
        for (auto [kind, size] : {Expect{GroupKind::tp, tp}, Expect{GroupKind::pp, pp}, Expect{GroupKind::dp, dp},
                                  Expect{GroupKind::model_parallel, tp * pp}}) {
          auto groups = Mesh::all_groups(s, kind);
          std::set<int> seen;
          for (const auto& g : groups) {
            ASSERT_EQ(static_cast<int>(g.size()), size) << Mesh::describe(s) << " " << group_kind_name(kind);
            for (int m : g) {
              EXPECT_TRUE(seen.insert(m).second) << "rank in two groups";
              EXPECT_EQ(Mesh::group_of(s, m, kind), g) << "members disagree";
            }
          }
          EXPECT_EQ(static_cast<int>(seen.size()), s.world());
        }
        // A tp group is consecutive ranks (stays inside a node).
        for (const auto& g : Mesh::all_groups(s, GroupKind::tp))
          for (size_t i = 1; i < g.size(); ++i) EXPECT_EQ(g[i], g[i - 1] + 1);
      }
}

TEST(Mesh, IndexInGroupMatchesCoordinate) {
  MeshShape s{4, 2, 3};
  for (int r = 0; r < s.world(); ++r) {
    Mesh m(s, r);
    EXPECT_EQ(m.index_in(GroupKind::tp), m.coord().tp);
    EXPECT_EQ(m.index_in(GroupKind::dp), m.coord().dp);
    EXPECT_EQ(m.index_in(GroupKind::pp), m.coord().pp);
  }
}

// Megatron-Core's order with context parallelism: tp fastest, then cp, then dp, then pp.
TEST(Mesh, CpSitsBetweenTpAndDp) {
  MeshShape s{2, 2, 2, 2};  // tp 2, pp 2, dp 2, cp 2: 16 ranks
  EXPECT_EQ(s.world(), 16);
  EXPECT_EQ(Mesh::coord_of(s, 1), (MeshCoord{0, 0, 1, 0}));
  EXPECT_EQ(Mesh::coord_of(s, 2), (MeshCoord{0, 0, 0, 1}));
  EXPECT_EQ(Mesh::coord_of(s, 4), (MeshCoord{0, 1, 0, 0}));
  EXPECT_EQ(Mesh::coord_of(s, 8), (MeshCoord{1, 0, 0, 0}));
  EXPECT_EQ(Mesh::coord_of(s, 15), (MeshCoord{1, 1, 1, 1}));
  EXPECT_EQ(Mesh::all_groups(s, GroupKind::cp)[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(Mesh::all_groups(s, GroupKind::dp)[0], (std::vector<int>{0, 4}));
  EXPECT_EQ(Mesh::all_groups(s, GroupKind::dp_cp)[0], (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(Mesh::all_groups(s, GroupKind::pp)[0], (std::vector<int>{0, 8}));
  // The model-parallel group (norms) holds one copy of the model: same dp and cp.
  EXPECT_EQ(Mesh::all_groups(s, GroupKind::model_parallel)[0], (std::vector<int>{0, 1, 8, 9}));
  for (int tp : {1, 2})
    for (int cp : {1, 2, 4})
      for (int dp : {1, 3}) {
        MeshShape m{tp, 2, dp, cp};
        for (int r = 0; r < m.world(); ++r) {
          EXPECT_EQ(Mesh::rank_of(m, Mesh::coord_of(m, r)), r);
          Mesh mesh(m, r);
          EXPECT_EQ(mesh.index_in(GroupKind::cp), mesh.coord().cp);
          // The dp × cp index: cp fastest (the ZeRO shard groups are its consecutive runs).
          EXPECT_EQ(mesh.index_in(GroupKind::dp_cp), mesh.coord().dp * cp + mesh.coord().cp);
        }
        for (auto [kind, size] : {std::pair{GroupKind::cp, cp}, {GroupKind::dp_cp, dp * cp}}) {
          std::set<int> seen;
          for (const auto& g : Mesh::all_groups(m, kind)) {
            ASSERT_EQ(int(g.size()), size);
            for (int x : g) EXPECT_TRUE(seen.insert(x).second);
          }
          EXPECT_EQ(int(seen.size()), m.world());
        }
      }
  EXPECT_EQ(Mesh::describe(s), "tp 2 × cp 2 × pp 2 × dp 2 = 16");
}

// Expert parallelism: an ep group is ep consecutive members of a dp × cp group (cp fastest), inside
// one pipeline stage and tp rank; ep does not multiply the world.
TEST(Mesh, EpGroupsAreConsecutiveRunsOfDpCp) {
  MeshShape s{2, 2, 2, 2, 2};  // tp 2, pp 2, dp 2, cp 2, ep 2: 16 ranks
  EXPECT_EQ(s.world(), 16);
  // Rank 0's dp × cp group is {0, 2, 4, 6} (cp index, then dp): its ep group the first two.
  EXPECT_EQ(Mesh::group_of(s, 0, GroupKind::ep), (std::vector<int>{0, 2}));
  EXPECT_EQ(Mesh::group_of(s, 4, GroupKind::ep), (std::vector<int>{4, 6}));
  EXPECT_EQ(Mesh::group_of(s, 13, GroupKind::ep), (std::vector<int>{13, 15}));
  EXPECT_EQ(Mesh::describe(s), "tp 2 × cp 2 × pp 2 × dp 2 = 16 (ep 2)");
  for (int cp : {1, 2})
    for (int dp : {1, 2, 4})
      for (int ep : {1, 2, 4}) {
        if ((dp * cp) % ep != 0) continue;
        MeshShape m{2, 2, dp, cp, ep};
        std::set<int> seen;
        for (const auto& g : Mesh::all_groups(m, GroupKind::ep)) {
          ASSERT_EQ(int(g.size()), ep);
          for (int x : g) EXPECT_TRUE(seen.insert(x).second);
          // Inside one dp × cp group, at consecutive positions of it, starting at a multiple of ep.
          Mesh first(m, g[0]);
          const auto dp_cp = first.group(GroupKind::dp_cp);
          const int at = first.index_in(GroupKind::dp_cp);
          EXPECT_EQ(at % ep, 0);
          for (int i = 0; i < ep; ++i) EXPECT_EQ(g[size_t(i)], dp_cp[size_t(at + i)]);
        }
        EXPECT_EQ(int(seen.size()), m.world());
      }
}

// The expert-data-parallel group: the members of a dp × cp group at the same index of their ep
// groups; with the ep groups it tiles the dp × cp group.
TEST(Mesh, EdpGroupsCrossTheEpGroups) {
  MeshShape s{1, 1, 4, 2, 2};  // dp 4, cp 2, ep 2: dp × cp = 8 ranks, ep groups [0 1] [2 3] ...
  EXPECT_EQ(Mesh::group_of(s, 0, GroupKind::ep), (std::vector<int>{0, 1}));
  EXPECT_EQ(Mesh::group_of(s, 0, GroupKind::edp), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(Mesh::group_of(s, 5, GroupKind::edp), (std::vector<int>{1, 3, 5, 7}));
  for (int ep : {1, 2, 4, 8}) {
    MeshShape m{2, 2, 4, 2, ep};
    for (int r = 0; r < m.world(); ++r) {
      Mesh mesh(m, r);
      const auto ep_group = mesh.group(GroupKind::ep), edp = mesh.group(GroupKind::edp);
      ASSERT_EQ(int(edp.size()), 8 / ep);
      // Exactly one rank in common (this one), and together they span dp × cp.
      std::set<int> both(ep_group.begin(), ep_group.end());
      for (int x : edp) both.insert(x);
      EXPECT_EQ(int(both.size()), ep + 8 / ep - 1);
      for (int x : edp) EXPECT_EQ(Mesh(m, x).index_in(GroupKind::ep), mesh.index_in(GroupKind::ep));
    }
  }
}
