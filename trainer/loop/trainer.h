// The training job of one rank (docs/architecture.md §2): data, model, optimizer, the step loop, evaluation,
// checkpoints, metrics, and the response to SIGTERM/SIGINT.
//
// Rules a reader could get wrong:
//  - Steps are counted as completed optimizer steps: "step 10" in logs, metrics and checkpoint
//    names means ten updates have been applied. The data position is consumed_samples, always
//    step × global_batch (skipped steps consume their samples too).
//  - Every decision that changes control flow (stop on a signal, skip a non-finite step) is agreed
//    on by all ranks through a collective before it is acted on, so ranks never diverge.
//  - A run is deterministic for a given recipe, world layout and thread count: resuming from a
//    checkpoint continues with bitwise the same losses as the uninterrupted run.
#pragma once

#include <string>
#include <vector>

#include "common/file_io.h"
#include "common/recipe/recipe.h"
#include "parallel/mesh.h"
#include "parallel/mesh_comms.h"
#include "trainer/placement/placement.h"

namespace llmtrain::trainer {

struct TrainContext {
  const Recipe* recipe = nullptr;  // resolved
  std::string recipe_yaml;         // the resolved recipe as YAML (run directory, checkpoints)
  const parallel::Mesh* mesh = nullptr;
  parallel::MeshComms* comms = nullptr;
  // What lives where on this rank, decided once where the mesh is made: place(recipe, layout_of(recipe),
  // mesh->coord()). The model, the step and the memory account read it; nothing re-derives it.
  const Placement* placement = nullptr;
  int threads = 1;  // CPU threads for this rank
  // train.device cuda: the device this rank holds (kernels::device_select, made current before
  // train() runs) and its description for the run's header; -1 when the caller selected none.
  int device = -1;
  std::string device_text;
  // What moves device memory between ranks and why ("nccl (NCCL 2.28.9)"); "" on cpu ranks.
  std::string device_comm_text;
  // --allow-change: recipe changes since the checkpoint that a resume accepts (trainer/checkpoint/checkpointer.h)
  std::vector<std::string> allowed_changes;
  FileSystem* fs = nullptr;  // checkpoint writes (tests inject faults); null = the real one
};

// Runs the job; returns the process exit status: kExitOk when train.steps are done, or
// kExitInterrupted after SIGTERM/SIGINT with a checkpoint written. Throws llmtrain::Error for
// user mistakes (missing data, non-finite loss with on_nonfinite: stop) and environment failures.
int train(const TrainContext& ctx);

}  // namespace llmtrain::trainer
