// Evaluation on the validation set: the mean loss over eval.batches global batches of data.valid,
// split over data-parallel ranks exactly as training splits a global batch, so the same samples (and
// the same loss) are evaluated at any layout and at every evaluation.
//
// With pipeline stages (pp > 1) each micro-batch's forward runs through the stages in turn: a stage
// receives its input from the previous one, runs its layers in activation slot 0 and sends its
// output on; the last stage computes the loss and broadcasts the mean over the pp control group.
#pragma once

#include "parallel/comm.h"
#include "trainer/data/micro_batches.h"
#include "trainer/model/model.h"

namespace llmtrain::trainer {

// Collective over `control_dp` (the data-parallel control group), and with pp > 1 over `pp` (the
// pipeline tensor group) and `control_pp` (its control group). `micro_batches`: per global batch on
// this rank; `global_batch`: samples per global batch.
float evaluate(Model& model, MicroBatchReader& valid, int batches, int micro_batches, int64_t global_batch,
               parallel::Comm& control_dp, parallel::Comm* pp = nullptr, parallel::Comm* control_pp = nullptr);

// The pp-group tag of evaluation's activations (clear of the pipeline executor's tags).
inline constexpr int kEvalActivationTag = 4094;

}  // namespace llmtrain::trainer
