// The device mesh: how world ranks map to (pp, dp, cp, tp) coordinates and which ranks form each
// communication group. Pure rank arithmetic, no MPI, so it is tested for many shapes directly.
//
// Order (docs/architecture.md §3, Megatron-Core's): tp varies fastest, then cp, then dp, then pp:
//     rank = pp_index * (dp * cp * tp) + dp_index * (cp * tp) + cp_index * tp + tp_index
// so a tensor-parallel group is tp consecutive ranks and stays inside one node, and a
// context-parallel group (one sequence split over cp ranks) is the next closest.
//
// Rule a reader could get wrong: parameters are replicated over cp as over dp, so gradients are
// reduced (and ZeRO shards) over the dp × cp group (GroupKind::dp_cp), while the data sampler
// splits batches over dp only: the cp ranks of one dp index read the same samples. An
// expert-parallel group (GroupKind::ep) is ep consecutive members of a dp × cp group (cp varies
// fastest there): ep does not multiply the world.
#pragma once

#include <string>
#include <vector>

namespace llmtrain::parallel {

struct MeshShape {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  int cp = 1;  // context parallelism: each sequence split over cp ranks
  int ep = 1;  // expert parallelism: carved from dp × cp (divides it), not a factor of the world
  int world() const { return tp * cp * pp * dp; }
};

struct MeshCoord {
  int pp = 0;
  int dp = 0;
  int tp = 0;
  int cp = 0;
  bool operator==(const MeshCoord&) const = default;
};

enum class GroupKind {
  tp,              // same (pp, dp): the ranks that split one layer's tensors
  pp,              // same (dp, tp): the stages of one pipeline
  dp,              // same (pp, tp): the replicas that average gradients
  model_parallel,  // same (dp, cp): every rank holding a distinct part of the model (global norms)
  cp,              // same (pp, dp, tp): the ranks that split one sequence (ring attention)
  dp_cp,           // same (pp, tp): the replicas of a parameter shard (gradient reduction, ZeRO)
  ep,              // ep consecutive members of a dp_cp group: the ranks splitting a MoE block's experts
  edp,             // the members of a dp_cp group at the same index of their ep groups: an expert's replicas
};

const char* group_kind_name(GroupKind kind);

class Mesh {
 public:
  Mesh(MeshShape shape, int rank);

  const MeshShape& shape() const { return shape_; }
  int rank() const { return rank_; }
  const MeshCoord& coord() const { return coord_; }

  static MeshCoord coord_of(const MeshShape& shape, int rank);
  static int rank_of(const MeshShape& shape, const MeshCoord& coord);

  // World ranks of this rank's group of `kind`, ascending; this rank's index in it.
  std::vector<int> group(GroupKind kind) const;
  int index_in(GroupKind kind) const;

  // Every group of `kind` in the mesh, each ascending, ordered by their first rank.
  static std::vector<std::vector<int>> all_groups(const MeshShape& shape, GroupKind kind);
  static std::vector<int> group_of(const MeshShape& shape, int rank, GroupKind kind);

  // "tp 2 × pp 1 × dp 4 = 8" ("tp 2 × cp 2 × pp 1 × dp 2 = 8" with cp > 1)
  static std::string describe(const MeshShape& shape);

 private:
  MeshShape shape_;
  int rank_;
  MeshCoord coord_;
};

}  // namespace llmtrain::parallel
