// The training step as a checkpoint sees it (docs/architecture.md §3, "The seams of the step
// engine"): the optimizer whose moments and master are saved, the gradient sync and layout that say
// which rank writes which slice, and the step's own state (its skip counters, fp16's loss scale).
// TrainStep (trainer/loop/train_step.h) implements it; the Checkpointer and rank_checkpoint_slices
// take it, so that checkpoint/ never includes loop/ (trainer/CMakeLists.txt, the rooms).
//
// Rule a reader could get wrong: a checkpoint holds the fp32 master of 16-bit parameters, so after
// any load (a weights-only start too) every rank calls params_from_master(), which rounds the
// master into the parameters and gathers them (collective over dp).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "common/recipe/layout.h"
#include "parallel/grad_sync.h"
#include "trainer/optim/optimizer.h"

namespace llmtrain::trainer {

class CheckpointedStep {
 public:
  virtual ~CheckpointedStep() = default;

  // The optimizer whose state a checkpoint holds (checkpoint_slices).
  virtual AdamW& optimizer() = 0;
  // Who writes what: the sync's first copies of the owned ranges, and the layout's expert groups.
  virtual const parallel::GradSync& grad_sync() const = 0;
  virtual const Layout& layout() const = 0;
  // 16-bit parameters: the parameters from a master loaded from a checkpoint (a no-op without one).
  virtual void params_from_master() = 0;
  // What a checkpoint keeps of the step's own state (the manifest's `extra`), and its restoration
  // with the step the checkpoint was written at; restore() checks what it reads (the manifest may be
  // anything) and throws llmtrain::Error naming the field.
  virtual nlohmann::json state() const = 0;
  virtual void restore(const nlohmann::json& state, int64_t step) = 0;
};

}  // namespace llmtrain::trainer
