// Evaluation on the validation set: the mean loss over eval.batches global batches of data.valid,
// split over data-parallel ranks exactly as training splits a global batch, so the same samples (and
// the same loss) are evaluated at any layout and at every evaluation.
//
// Each global batch runs through the pipeline executor (parallel/pipeline_executor.h) that runs the
// training step, on a forward-only list: the training schedule's forwards and their transfers in
// their order (parallel::forward_only_schedule), so every schedule, virtual chunks, tensor and
// sequence parallelism evaluate the way they train, and one rank runs the one-stage list F0 F1 ....
// Every forward uses the model's activation slot 0.
//
// The rule a reader could get wrong: the loss is read once per global batch, not per micro-batch
// (each micro-batch's loss is copied into a device buffer by an op); the micro-batch losses are
// summed on the last stage in double, batch by batch and micro-batch by micro-batch, and the mean is
// broadcast over the pp control group and averaged over the dp control group.
#pragma once

#include <memory>
#include <vector>

#include "kernels/buffer.h"
#include "parallel/mesh_comms.h"
#include "parallel/pipeline_executor.h"
#include "parallel/pipeline_schedule.h"
#include "trainer/data/micro_batches.h"
#include "trainer/model/model.h"

namespace llmtrain::trainer {

class Evaluator {
 public:
  // `schedule`: this stage's training list (TrainStep::schedule()), over `micro_batches` micro-batches
  // per global batch of `global_batch` samples; `batches`: global batches per evaluation. The model,
  // the reader and the communicators must outlive the evaluator; it allocates its receive buffers
  // and loss buffer here (train() builds one per evaluation, so that training does not hold them).
  Evaluator(Model& model, MicroBatchReader& valid, int batches, int micro_batches, int64_t global_batch,
            const std::vector<parallel::PipeOp>& schedule, parallel::MeshComms& comms);
  ~Evaluator();
  Evaluator(const Evaluator&) = delete;
  Evaluator& operator=(const Evaluator&) = delete;

  // The mean validation loss. Collective over the pp group and the dp and pp control groups.
  float run();

 private:
  class Stage;

  int batches_, micro_batches_;
  int64_t global_batch_;
  parallel::MeshComms& comms_;
  kernels::Buffer losses_;  // [micro_batches] on the model's device (the last stage's)
  std::vector<float> losses_host_;
  std::unique_ptr<Stage> stage_;
  std::unique_ptr<parallel::PipelineExecutor> executor_;
};

}  // namespace llmtrain::trainer
