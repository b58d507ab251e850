#include "parallel/mesh_comms.h"

#include <fmt/format.h>

#include "common/error.h"

namespace llmtrain::parallel {

Comm& MeshComms::group(GroupKind kind) const {
  switch (kind) {
    case GroupKind::tp:
      return *tp;
    case GroupKind::pp:
      return *pp;
    case GroupKind::dp:
      return *dp;
    case GroupKind::model_parallel:
      return *mp;
  }
  LT_CHECK(false, "group kind {}", static_cast<int>(kind));
  return *world;
}

void MeshComms::set_timeout(double seconds) {
  for (auto* c : {world.get(), tp.get(), pp.get(), dp.get(), mp.get()})
    if (c) c->set_timeout(seconds);
}

MeshComms make_mesh_comms(const Mesh& mesh, std::unique_ptr<Comm> world) {
  LT_CHECK(world != nullptr);
  const MeshShape& shape = mesh.shape();
  if (world->size() != shape.world())
    throw Error(fmt::format("the job has {} ranks but the layout needs {}", world->size(), Mesh::describe(shape)),
                fmt::format("start {} ranks, or change parallel.tp/pp/dp (parallel.dp: auto fills in the world size)",
                            shape.world()));
  LT_CHECK(world->rank() == mesh.rank(), "mesh of rank {} on world rank {}", mesh.rank(), world->rank());

  MeshComms out;
  auto make = [&](GroupKind kind) {
    const std::vector<int> members = mesh.group(kind);
    const char* name = group_kind_name(kind);
    std::unique_ptr<Comm> c;
    if (members.size() == 1) {
      c = make_local_comm(name);
      c->set_timeout(world->timeout());
    } else {
      // The group's lowest world rank is its color (unique per group); world rank orders it.
      c = world->split(members.front(), mesh.rank(), name);
    }
    LT_CHECK(c->size() == static_cast<int>(members.size()) && c->rank() == mesh.index_in(kind),
             "group {} of rank {}: size {} rank {}, expected size {} rank {}", name, mesh.rank(), c->size(), c->rank(),
             members.size(), mesh.index_in(kind));
    return c;
  };
  out.tp = make(GroupKind::tp);
  out.pp = make(GroupKind::pp);
  out.dp = make(GroupKind::dp);
  out.mp = make(GroupKind::model_parallel);
  out.world = std::move(world);
  return out;
}

}  // namespace llmtrain::parallel
