// The communicators of a mesh: this rank's tp, pp and dp groups that move tensors, and the host
// "control" groups that move scalars, all made from the world communicator. Passed explicitly to
// whoever needs them (no global process groups).
//
// Rules a reader could get wrong:
//  - Tensor groups (tp, pp, dp) carry activations, gradients and parameters; with the CUDA backend
//    they move device memory (NCCL, or the staged communicator over MPI: parallel/comm/device_comm.h). Control groups
//    carry host scalars and agreement only — losses, squared norms, the stop flag, checkpoint agreement and the strings
//    it gathers — and are MPI over host memory on every backend, so a scalar never needs a device buffer and never
//    waits behind a tensor collective on the same communicator. Never put a tensor on a control group, nor a host
//    scalar on a tensor group.
//  - make_mesh_comms is collective over the world: every rank calls it, with the same shape.
//  - A group kind whose groups have one rank (tp = 1, say) gets a one-rank Comm and costs no MPI
//    call, so a one-rank job (or MPI not initialised at all) gets one-rank Comms throughout.
//  - Each group's ranks are ordered by world rank, so a rank's index in its group is its mesh
//    coordinate along that dimension (Mesh::index_in) — the pp group's rank is the stage.
#pragma once

#include <memory>

#include "parallel/comm/comm.h"
#include "parallel/comm/device_comm.h"
#include "parallel/mesh.h"
#include "parallel/pipe_links.h"

namespace llmtrain::parallel {

// Host communicators for scalars, one per group kind and one over the whole world. Names: "world
// control", "dp control", ...
struct ControlComms {
  std::unique_ptr<Comm> world;
  std::unique_ptr<Comm> tp;
  std::unique_ptr<Comm> pp;
  std::unique_ptr<Comm> dp;
  std::unique_ptr<Comm> mp;  // model-parallel (tp × pp): sums of squared norms
  // dp × cp (cp > 1 only; null at cp 1, where it is the dp group): the loss's mean over every
  // rank that computed a part of it.
  std::unique_ptr<Comm> dp_cp;

  Comm& group(GroupKind kind) const;
  // The group the loss is averaged over: dp × cp (dp at cp 1).
  Comm& replicas() const { return dp_cp ? *dp_cp : *dp; }
};

struct MeshComms {
  std::unique_ptr<Comm> world;  // the job's world, which the groups were split from
  std::unique_ptr<Comm> tp;     // "tp": tensor-parallel activations and gradients
  std::unique_ptr<Comm> pp;     // "pp": the tied embedding's gradient between the first and last stage
  PipeLinks pipe;               // split from pp: activations and gradients between neighbouring stages
  std::unique_ptr<Comm> dp;     // "dp": the data-parallel replicas (the sampler's split)
  std::unique_ptr<Comm> cp;     // "cp": the ranks splitting one sequence (ring attention's K/V blocks)
  std::unique_ptr<Comm> ep;     // "ep": the ranks splitting a MoE block's experts (token all-to-all)
  std::unique_ptr<Comm> edp;    // "edp" (ep > 1 only): an expert's replicas, dp × cp / ep ranks
  // "dp-cp" (cp > 1 only; null at cp 1, where it is the dp group): every rank holding the same
  // parameters — gradient reduction, ZeRO shards and parameter gathers span it.
  std::unique_ptr<Comm> dp_cp;
  ControlComms control;

  // The tensor group of `kind` (tp, pp, dp, cp or dp_cp; the model-parallel group only exists for
  // control).
  Comm& group(GroupKind kind) const;
  // The gradient reduction's group: dp × cp (dp at cp 1).
  Comm& replicas() const { return dp_cp ? *dp_cp : *dp; }
  // Every group's timeout (parallel.timeout), control groups and world included.
  void set_timeout(double seconds);
};

// Splits `world` (which it keeps) along `mesh`. Throws llmtrain::Error when the world does not
// have the mesh's size, naming every factor. On `device` cuda the tensor groups of more than one rank
// move device memory through `device_comm`: NCCL communicators (parallel/comm/comm_nccl.h, each recorded
// in the flight recorder) or the staged communicator (parallel/comm/comm_staged.h), over the host groups.
MeshComms make_mesh_comms(const Mesh& mesh, std::unique_ptr<Comm> world, kernels::Device device = kernels::Device::cpu,
                          DeviceComm device_comm = DeviceComm::staged);

}  // namespace llmtrain::parallel
