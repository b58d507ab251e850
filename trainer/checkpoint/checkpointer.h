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
//  - save(), step_boundary(), save_final() and resume() are collective over the world control group:
//    every rank calls them, at the same steps.
//  - With checkpoint.async, last_saved() is the last COMMITTED step: a save in flight counts only
//    once every rank has written it and rank 0 has renamed it into place.
//  - One job writes a checkpoint directory: checkpoint_dir_lock() takes its lock (rank 0, agreed by
//    all) before the run writes anything, and refuses, naming the holder, when another live job has
//    it; the checkpointer holds it (and, holding it, removes the `.partial` directories of saves that
//    died: no live job can be writing them) and its destructor releases it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "common/checkpoint_dir.h"
#include "common/file_io.h"
#include "common/recipe/recipe.h"
#include "parallel/comm/comm.h"
#include "trainer/checkpoint/async_checkpoint.h"
#include "trainer/checkpoint/checkpointed_step.h"
#include "trainer/data/gpt_dataset.h"
#include "trainer/data/tokenizer.h"
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

// This rank's slices of `model` and its step's optimizer (checkpoint_slices) with who writes each:
// parameters the first rank of the dp × cp group (`replica`: this rank's index in it), moments the
// gradient sync's first copies; sharded experts the first rank of their expert-data-parallel group
// (replica < ep) and the expert sync's first copies. What the Checkpointer saves and the memory
// plan's checkpoint_snapshot counts.
std::vector<CheckpointSlice> rank_checkpoint_slices(const Model& model, CheckpointedStep& step, int replica,
                                                    bool moments = true);

// The checkpoint a run with `cc` would continue from: its own newest in checkpoint.dir, or on its
// first start the one checkpoint.resume names (unless load_weights_only: a fine-tuning start
// compares nothing); "" when it starts fresh. What `llmtrain run` compares before any rank starts
// (the ranks may still fall back past a damaged one, and compare that one).
std::string checkpoint_to_continue(const CheckpointConfig& cc);

// Throws llmtrain::Error naming each change since `step_dir` was written (its manifest's recipe
// against `recipe_yaml`) that `allowed` does not cover (common/recipe/recipe_changes.h). Nothing
// for "" or a manifest it cannot read (loading it says why).
void check_resume_changes(const std::string& step_dir, const std::string& recipe_yaml,
                          const std::vector<std::string>& allowed);

// One job writes a checkpoint directory: rank 0 takes `dir`'s lock (common/checkpoint_dir.h),
// agreed by every rank; a live holder's refusal is every rank's error. Taken before the run writes
// anything (its recipe.yaml, its log), so that a run the lock refuses leaves the holder's run as it
// was. Null on the other ranks.
std::unique_ptr<CheckpointDirLock> checkpoint_dir_lock(const std::string& dir, parallel::Comm& world);

class Checkpointer {
 public:
  // Everything given must outlive the checkpointer. `world` is the world control group.
  // `data` identifies the training data (data_identity()): saved with each checkpoint, and a full
  // resume refuses a checkpoint written with other data.
  // `lock` is checkpoint_dir_lock()'s (rank 0's; null elsewhere), taken before the run wrote anything.
  Checkpointer(const Recipe& recipe, const std::string& recipe_yaml, const Tokenizer& tokenizer, Model& model,
               CheckpointedStep& step, int dp_rank, parallel::Comm& world, FileSystem& fs,
               std::unique_ptr<CheckpointDirLock> lock, nlohmann::json data = {});

  // The recipe changes a resume accepts besides the harmless ones (--allow-change: keys, sections,
  // "all"; common/recipe/recipe_changes.h). Others are refused, naming each.
  void set_allowed_changes(std::vector<std::string> allowed) { allowed_changes_ = std::move(allowed); }
  // Loads what checkpoint.resume says into the model, the optimizer and the step's state, and
  // returns the position to continue from ({0, 0} for a fresh start or a weights-only start).
  RunPosition resume();
  // Writes a checkpoint of the current state at `at`; returns the seconds the training thread spent
  // on it. With checkpoint.async the write goes on in the background (async_checkpoint.h): this
  // first waits for the save in flight, if any, then holds the step only for the snapshot.
  double save(const RunPosition& at);
  // At every step boundary, `step` the steps done (collective; with checkpoint.async): commits the
  // save in flight when every rank has written its part. Returns the seconds the training thread
  // spent on it.
  double step_boundary(int64_t step);
  // At a stop or the end of the run: waits for the save in flight and commits it, then saves `at`
  // unless that is what the last committed checkpoint holds. A failure of this last save throws
  // (there is no next save to try); a failure of the one in flight is a warning, as at any step.
  double save_final(const RunPosition& at);
  // The step of the last checkpoint committed or resumed from by this process (-1: none).
  int64_t last_saved() const { return last_saved_; }
  // Host bytes the asynchronous save's snapshot holds (0: synchronous saves, or none yet).
  int64_t snapshot_bytes() const;
  // A test hook (fault injection) run on the background writer of every asynchronous save.
  void set_writer_hook(AsyncCheckpointWriter::WriterHook hook);
  // Renews the checkpoint directory's lock when a minute has passed since the last renewal (rank 0;
  // cheap to call every step).
  void keep_lock();

 private:
  // This rank's slices of the model and optimizer (checkpoint_slices), with who writes each.
  std::vector<CheckpointSlice> slices(bool moments = true) const;

  const Recipe& recipe_;
  const std::string& recipe_yaml_;
  const Tokenizer& tokenizer_;
  Model& model_;
  CheckpointedStep& step_;
  int dp_rank_;
  parallel::Comm& world_;
  FileSystem& fs_;
  nlohmann::json data_;
  std::vector<std::string> allowed_changes_;
  int64_t last_saved_ = -1;
  std::unique_ptr<CheckpointDirLock> lock_;  // rank 0's lock on checkpoint.dir (common/checkpoint_dir.h)
  double lock_renewed_ = 0;
  // checkpoint.async's writer; declared after the lock so that it is destroyed (its writer waited
  // for) before the lock is released.
  std::unique_ptr<AsyncCheckpointWriter> async_;

  CheckpointMeta meta_at(const RunPosition& at) const;
  // Logs an asynchronous save's outcome; returns its seconds on the training thread.
  double report(const AsyncSaveResult& r);
};

}  // namespace llmtrain::trainer
