#include "parallel/mesh_comms.h"

#include <fmt/format.h>

#include "common/error.h"
#include "parallel/comm/comm_nccl.h"
#include "parallel/comm/comm_staged.h"
#include "parallel/comm/flight_recorder.h"

namespace llmtrain::parallel {

Comm& ControlComms::group(GroupKind kind) const {
  switch (kind) {
    case GroupKind::tp:
      return *tp;
    case GroupKind::pp:
      return *pp;
    case GroupKind::dp:
      return *dp;
    case GroupKind::model_parallel:
      return *mp;
    case GroupKind::dp_cp:
      return replicas();
    case GroupKind::cp:
    case GroupKind::ep:
    case GroupKind::edp:
      break;  // no scalar crosses the cp, ep or edp group alone
  }
  LT_CHECK(false, "no control group of kind {}", group_kind_name(kind));
  return *world;
}

Comm& MeshComms::group(GroupKind kind) const {
  LT_CHECK(kind != GroupKind::model_parallel,
           "no tensor group of kind {} (the model-parallel group is a control group)", group_kind_name(kind));
  switch (kind) {
    case GroupKind::tp:
      return *tp;
    case GroupKind::pp:
      return *pp;
    case GroupKind::cp:
      return *cp;
    case GroupKind::dp_cp:
      return replicas();
    case GroupKind::ep:
      return *ep;
    case GroupKind::edp:
      LT_CHECK(edp != nullptr, "no edp group at ep 1");
      return *edp;
    default:
      return *dp;
  }
}

void MeshComms::set_timeout(double seconds) {
  for (auto* c :
       {world.get(), tp.get(), pp.get(), dp.get(), cp.get(), dp_cp.get(), ep.get(), edp.get(), control.world.get(),
        control.tp.get(), control.pp.get(), control.dp.get(), control.mp.get(), control.dp_cp.get()})
    if (c) c->set_timeout(seconds);
  pipe.set_timeout(seconds);
}

MeshComms make_mesh_comms(const Mesh& mesh, std::unique_ptr<Comm> world, kernels::Device device,
                          DeviceComm device_comm) {
  LT_CHECK(world != nullptr);
  const MeshShape& shape = mesh.shape();
  if (world->size() != shape.world())
    throw Error(
        fmt::format("the job has {} ranks but the layout needs {}", world->size(), Mesh::describe(shape)),
        fmt::format("start {} ranks, or change parallel.tp/cp/pp/dp (parallel.dp: auto fills in the world size)",
                    shape.world()));
  LT_CHECK(world->rank() == mesh.rank(), "mesh of rank {} on world rank {}", mesh.rank(), world->rank());

  // Every rank makes the same splits in the same order (split is collective over the world).
  auto make = [&](const std::vector<int>& members, int index, std::string name) {
    std::unique_ptr<Comm> c;
    if (members.size() == 1) {
      c = make_local_comm(name);
      c->set_timeout(world->timeout());
    } else {
      // The group's lowest world rank is its color (unique per group); world rank orders it.
      c = world->split(members.front(), mesh.rank(), name);
    }
    LT_CHECK(c->size() == static_cast<int>(members.size()) && c->rank() == index,
             "group {} of rank {}: size {} rank {}, expected size {} rank {}", name, mesh.rank(), c->size(), c->rank(),
             members.size(), index);
    return c;
  };
  // Device tensors move through NCCL or the staged communicator (device -> pinned host -> MPI ->
  // device); a one-rank group's copies are the device's own.
  auto tensor = [&](GroupKind kind) {
    std::unique_ptr<Comm> c = make(mesh.group(kind), mesh.index_in(kind), group_kind_name(kind));
    if (device == kernels::Device::cuda && c->size() > 1)
      c = device_comm == DeviceComm::nccl ? with_flight_recorder(make_nccl_comm(std::move(c)))
                                          : make_staged_comm(std::move(c));
    return c;
  };
  auto control = [&](GroupKind kind) {
    return make(mesh.group(kind), mesh.index_in(kind), fmt::format("{} control", group_kind_name(kind)));
  };
  std::vector<int> everyone(static_cast<size_t>(shape.world()));
  for (int r = 0; r < shape.world(); ++r) everyone[static_cast<size_t>(r)] = r;

  MeshComms out;
  out.tp = tensor(GroupKind::tp);
  out.pp = tensor(GroupKind::pp);
  out.pipe = make_pipe_links(*out.pp);
  out.dp = tensor(GroupKind::dp);
  out.cp = tensor(GroupKind::cp);
  if (shape.cp > 1) out.dp_cp = tensor(GroupKind::dp_cp);
  out.ep = tensor(GroupKind::ep);
  if (shape.ep > 1) out.edp = tensor(GroupKind::edp);
  out.control.world = make(everyone, mesh.rank(), "world control");
  out.control.tp = control(GroupKind::tp);
  out.control.pp = control(GroupKind::pp);
  out.control.dp = control(GroupKind::dp);
  out.control.mp = control(GroupKind::model_parallel);
  if (shape.cp > 1) out.control.dp_cp = control(GroupKind::dp_cp);
  out.world = std::move(world);
  return out;
}

}  // namespace llmtrain::parallel
