// A run's checkpoints as the training loop uses them: where the run starts (a fresh start, the
// run's own newest checkpoint, a given checkpoint, or a given checkpoint's weights only) and the
// saves every checkpoint.every steps, at a stop and at the end. The format and the collective
// save/load are trainer/checkpoint/checkpoint.h's; this is the policy around them.
//
// Rules a reader could get wrong:
//  - checkpoint.resume: <path> (with or without load_weights_only) says how a run STARTS: once
//    checkpoint.dir holds checkpoints of the run itself, the same command continues from the newest
//    of those (after exit 75, a crash or a preemption), and says so.
//  - A checkpoint records the data position (samples consumed, always step × global_batch) and the
//    training step's own state (skip counters); a checkpoint written with another global batch is
//    refused for a full resume.
//  - save() and resume() are collective over the world control group: every rank calls them.
//  - One job writes a checkpoint directory: the constructor takes its lock (rank 0, agreed by all)
//    and refuses, naming the holder, when another live job has it; the destructor releases it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "common/checkpoint_dir.h"
#include "common/file_io.h"
#include "common/recipe/recipe.h"
#include "parallel/comm.h"
#include "trainer/data/gpt_dataset.h"
#include "trainer/data/tokenizer.h"
#include "trainer/loop/train_step.h"
#include "trainer/model/model.h"

namespace llmtrain::trainer {

// The training data's identity for checkpoints: per source, its documents, tokens and the CRC-32C
// of its .idx sequence lengths (the contents, not the path).
nlohmann::json data_identity(const GptDataset& data);

// Where a run stands: optimizer steps done and samples consumed.
struct RunPosition {
  int64_t step = 0;
  int64_t consumed_samples = 0;
};

class Checkpointer {
 public:
  // Everything given must outlive the checkpointer. `world` is the world control group.
  // `data` identifies the training data (data_identity()): saved with each checkpoint, and a full
  // resume refuses a checkpoint written with other data.
  Checkpointer(const Recipe& recipe, const std::string& recipe_yaml, const Tokenizer& tokenizer, Model& model,
               TrainStep& step, int dp_rank, parallel::Comm& world, FileSystem& fs, nlohmann::json data = {});

  // Loads what checkpoint.resume says into the model, the optimizer and the step's state, and
  // returns the position to continue from ({0, 0} for a fresh start or a weights-only start).
  RunPosition resume();
  // Writes a checkpoint of the current state at `at`; returns the seconds it took.
  double save(const RunPosition& at);
  // The step of the last checkpoint written or resumed from by this process (-1: none).
  int64_t last_saved() const { return last_saved_; }
  // Renews the checkpoint directory's lock when a minute has passed since the last renewal (rank 0;
  // cheap to call every step).
  void keep_lock();

 private:
  const Recipe& recipe_;
  const std::string& recipe_yaml_;
  const Tokenizer& tokenizer_;
  Model& model_;
  TrainStep& step_;
  int dp_rank_;
  parallel::Comm& world_;
  FileSystem& fs_;
  nlohmann::json data_;
  int64_t last_saved_ = -1;
  std::unique_ptr<CheckpointDirLock> lock_;  // rank 0's lock on checkpoint.dir (common/checkpoint_dir.h)
  double lock_renewed_ = 0;
};

}  // namespace llmtrain::trainer
