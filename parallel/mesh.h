// The device mesh: how world ranks map to (pp, dp, tp) coordinates and which ranks form each
// communication group. Pure rank arithmetic, no MPI, so it is tested for many shapes directly.
//
// Order (docs/architecture.md §3, Megatron's default): tp varies fastest, then dp, then pp:
//     rank = pp_index * (dp * tp) + dp_index * tp + tp_index
// so a tensor-parallel group is tp consecutive ranks and stays inside one node.
#pragma once

#include <string>
#include <vector>

namespace llmtrain::parallel {

struct MeshShape {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  int world() const { return tp * pp * dp; }
};

struct MeshCoord {
  int pp = 0;
  int dp = 0;
  int tp = 0;
  bool operator==(const MeshCoord&) const = default;
};

enum class GroupKind {
  tp,              // same (pp, dp): the ranks that split one layer's tensors
  pp,              // same (dp, tp): the stages of one pipeline
  dp,              // same (pp, tp): the replicas that average gradients
  model_parallel,  // same dp: every rank holding a distinct part of the model (global norms)
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

  // "tp 2 × pp 1 × dp 4 = 8"
  static std::string describe(const MeshShape& shape);

 private:
  MeshShape shape_;
  int rank_;
  MeshCoord coord_;
};

}  // namespace llmtrain::parallel
