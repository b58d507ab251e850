// The layout: how a resolved recipe places the job on ranks, devices and memory — the mesh, ZeRO's
// stage and shard groups, what is sharded or held outside the model, the pipeline schedule,
// precision. Computed once from the resolved recipe by layout_of(); the model's options, the
// gradient sync, the memory account, the planner and the checkpointer read this value and derive
// none of it again (docs/architecture.md §3 "One layout value").
//
// Rules a reader could get wrong: ep (expert parallelism) is carved from the dp × cp ranks, so it
// is not a factor of world(). Parameters are replicated over cp as over dp (the experts' over the
// expert-data-parallel ranks, experts_sharded()): the gradient sync and ZeRO span dp × cp ranks
// (replicas()), and a ZeRO shard group is zero_group dp ranks × cp (shard_group counts ranks of the dp × cp group).
#pragma once

#include <string>
#include <vector>

#include "common/recipe/recipe.h"

namespace llmtrain {

struct Layout {
  // The mesh (docs/parallel.md: tp fastest, then cp, then dp, then pp).
  int tp = 1;
  int pp = 1;
  int dp = 1;
  int cp = 1;  // context parallelism: each sequence split over cp ranks
  CpComm cp_comm = CpComm::ring;
  int ep = 1;  // expert parallelism: ep consecutive ranks of dp × cp split the experts (not a factor of world())

  // ZeRO: the stage, and how many consecutive ranks of the dp × cp group one shard group spans
  // (zero_group · cp; 1 = nothing is sharded; below dp × cp = hybrid sharding, each shard
  // all-reduced across the replicas() / shard_group groups).
  int zero = 0;
  int shard_group = 1;

  // The pipeline: its schedule (pp 1 runs the one-stage loop whatever it is named), model chunks per
  // rank, and blocks per stage (pp_layers; empty = layers / (pp · virtual_stages) on every chunk).
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  int virtual_stages = 1;
  std::vector<int> stage_blocks;
  bool sequence_parallel = false;

  DeviceKind device = DeviceKind::cpu;
  Precision precision = Precision::fp32;
  bool master = true;  // optimizer.master
  GradReduceDtype grad_reduce = GradReduceDtype::fp32;
  ActivationCheckpointing recompute = ActivationCheckpointing::none;
  double bucket_mb = 25.0;

  int world() const { return tp * cp * dp * pp; }
  // What each ZeRO stage moves out of every rank's full copy: optimizer state (1), gradients (2),
  // parameters (3). From stage 2 the gradient sync holds the gradients, from 3 the parameters too:
  // the model is built without those buffers and asks the sync for them.
  bool optimizer_sharded() const { return zero >= 1; }
  bool gradients_sharded() const { return zero >= 2; }
  bool parameters_sharded() const { return zero >= 3; }
  int shard_groups() const { return replicas() / shard_group; }
  // The ranks holding the same parameters: dp × cp (the gradient reduction's group).
  int replicas() const { return dp * cp; }
  // Tokens of one sequence on a rank: seq_len / cp.
  int64_t local_seq(int64_t seq_len) const { return seq_len / cp; }
  // 16-bit parameters keep an fp32 master copy in the optimizer, except at ZeRO 3, where the owned
  // shard is fp32 and is the master.
  // optimizer.master false: none (bf16 parameters updated in place).
  bool fp32_master() const { return precision != Precision::fp32 && !parameters_sharded() && master; }
  // Expert parallelism at ZeRO 0 and 1: each rank holds only its ep rank's E/ep experts of every MoE
  // block (weights, gradients, optimizer state), their gradients reduced (and at ZeRO 1 their
  // optimizer state sharded) over the expert-data-parallel group, the replicas() / ep ranks of the
  // same ep index. At ZeRO 2 and 3 ZeRO's shards over dp × cp hold every expert instead.
  bool experts_sharded() const { return ep > 1 && !gradients_sharded(); }
  int expert_replicas() const { return replicas() / ep; }

  // "stage 1, optimizer state sharded over 4 dp ranks (zero_group 2: 2 shard groups ...)"; "" at 0.
  std::string describe_zero() const;
};

// The layout of a resolved recipe (every auto filled: recipe_resolve).
Layout layout_of(const Recipe& resolved);

}  // namespace llmtrain
