#include "parallel/mesh.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/enum_names.h"
#include "common/error.h"

namespace llmtrain::parallel {

namespace {
constexpr EnumName<GroupKind> kGroupKinds[] = {{"tp", GroupKind::tp}, {"pp", GroupKind::pp},
                                               {"dp", GroupKind::dp}, {"model-parallel", GroupKind::model_parallel},
                                               {"cp", GroupKind::cp}, {"dp-cp", GroupKind::dp_cp},
                                               {"ep", GroupKind::ep}, {"edp", GroupKind::edp}};
}  // namespace

const char* group_kind_name(GroupKind kind) { return enum_name(kGroupKinds, kind); }

Mesh::Mesh(MeshShape shape, int rank) : shape_(shape), rank_(rank), coord_(coord_of(shape, rank)) {}

MeshCoord Mesh::coord_of(const MeshShape& s, int rank) {
  LT_CHECK(s.tp > 0 && s.pp > 0 && s.dp > 0 && s.cp > 0 && s.ep > 0 && (s.dp * s.cp) % s.ep == 0, "mesh {}",
           describe(s));
  LT_CHECK(rank >= 0 && rank < s.world(), "rank {} outside mesh {}", rank, describe(s));
  MeshCoord c;
  c.tp = rank % s.tp;
  c.cp = (rank / s.tp) % s.cp;
  c.dp = (rank / (s.tp * s.cp)) % s.dp;
  c.pp = rank / (s.tp * s.cp * s.dp);
  return c;
}

int Mesh::rank_of(const MeshShape& s, const MeshCoord& c) {
  LT_CHECK(c.tp >= 0 && c.tp < s.tp && c.cp >= 0 && c.cp < s.cp && c.dp >= 0 && c.dp < s.dp && c.pp >= 0 &&
           c.pp < s.pp);
  return ((c.pp * s.dp + c.dp) * s.cp + c.cp) * s.tp + c.tp;
}

std::vector<int> Mesh::group_of(const MeshShape& s, int rank, GroupKind kind) {
  MeshCoord c = coord_of(s, rank);
  std::vector<int> out;
  switch (kind) {
    case GroupKind::tp:
      for (int i = 0; i < s.tp; ++i) out.push_back(rank_of(s, {c.pp, c.dp, i, c.cp}));
      break;
    case GroupKind::pp:
      for (int i = 0; i < s.pp; ++i) out.push_back(rank_of(s, {i, c.dp, c.tp, c.cp}));
      break;
    case GroupKind::dp:
      for (int i = 0; i < s.dp; ++i) out.push_back(rank_of(s, {c.pp, i, c.tp, c.cp}));
      break;
    case GroupKind::model_parallel:
      for (int p = 0; p < s.pp; ++p)
        for (int t = 0; t < s.tp; ++t) out.push_back(rank_of(s, {p, c.dp, t, c.cp}));
      break;
    case GroupKind::cp:
      for (int i = 0; i < s.cp; ++i) out.push_back(rank_of(s, {c.pp, c.dp, c.tp, i}));
      break;
    case GroupKind::dp_cp:
      for (int d = 0; d < s.dp; ++d)
        for (int i = 0; i < s.cp; ++i) out.push_back(rank_of(s, {c.pp, d, c.tp, i}));
      break;
    case GroupKind::ep: {
      // This rank's position in its dp × cp group, rounded down to a multiple of ep: the first member.
      const int first = (c.dp * s.cp + c.cp) / s.ep * s.ep;
      for (int i = first; i < first + s.ep; ++i) out.push_back(rank_of(s, {c.pp, i / s.cp, c.tp, i % s.cp}));
      break;
    }
    case GroupKind::edp:
      for (int i = (c.dp * s.cp + c.cp) % s.ep; i < s.dp * s.cp; i += s.ep)
        out.push_back(rank_of(s, {c.pp, i / s.cp, c.tp, i % s.cp}));
      break;
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int> Mesh::group(GroupKind kind) const { return group_of(shape_, rank_, kind); }

int Mesh::index_in(GroupKind kind) const {
  auto g = group(kind);
  return static_cast<int>(std::find(g.begin(), g.end(), rank_) - g.begin());
}

std::vector<std::vector<int>> Mesh::all_groups(const MeshShape& s, GroupKind kind) {
  std::vector<std::vector<int>> groups;
  std::vector<bool> seen(s.world(), false);
  for (int r = 0; r < s.world(); ++r) {
    if (seen[r]) continue;
    auto g = group_of(s, r, kind);
    for (int m : g) seen[m] = true;
    groups.push_back(std::move(g));
  }
  return groups;
}

std::string Mesh::describe(const MeshShape& s) {
  if (s.ep > 1) {
    MeshShape dense = s;
    dense.ep = 1;
    return fmt::format("{} (ep {})", describe(dense), s.ep);
  }
  if (s.cp > 1) return fmt::format("tp {} × cp {} × pp {} × dp {} = {}", s.tp, s.cp, s.pp, s.dp, s.world());
  return fmt::format("tp {} × pp {} × dp {} = {}", s.tp, s.pp, s.dp, s.world());
}

}  // namespace llmtrain::parallel
