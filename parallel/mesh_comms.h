// The communicators of a mesh: this rank's tp, pp, dp and model-parallel groups, made from the
// world communicator. Passed explicitly to whoever needs them (no global process groups).
//
// Rules a reader could get wrong:
//  - make_mesh_comms is collective over the world: every rank calls it, with the same shape.
//  - A group kind whose groups have one rank (tp = 1, say) gets a one-rank Comm and costs no MPI
//    call, so a one-rank job (or MPI not initialised at all) gets one-rank Comms throughout.
//  - Each group's ranks are ordered by world rank, so a rank's index in its group is its mesh
//    coordinate along that dimension (Mesh::index_in) — the pp group's rank is the stage.
#pragma once

#include <memory>

#include "parallel/comm.h"
#include "parallel/mesh.h"

namespace llmtrain::parallel {

struct MeshComms {
  std::unique_ptr<Comm> world;  // "world"
  std::unique_ptr<Comm> tp;     // "tp"
  std::unique_ptr<Comm> pp;     // "pp"
  std::unique_ptr<Comm> dp;     // "dp"
  std::unique_ptr<Comm> mp;     // "model-parallel": tp × pp, for global norms

  Comm& group(GroupKind kind) const;
  // Every group's timeout (parallel.timeout), world included.
  void set_timeout(double seconds);
};

// Splits `world` (which it keeps) along `mesh`. Throws llmtrain::Error when the world does not
// have the mesh's size, naming every factor.
MeshComms make_mesh_comms(const Mesh& mesh, std::unique_ptr<Comm> world);

}  // namespace llmtrain::parallel
