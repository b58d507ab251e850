// Evaluation on the validation set: the mean loss over eval.batches global batches of data.valid,
// split over data-parallel ranks exactly as training splits a global batch, so the same samples (and
// the same loss) are evaluated at any layout and at every evaluation.
#pragma once

#include "parallel/comm.h"
#include "trainer/data/micro_batches.h"
#include "trainer/model/model.h"

namespace llmtrain::trainer {

// Collective over `control_dp` (the data-parallel control group). `micro_batches`: per global batch
// on this rank; `global_batch`: samples per global batch.
float evaluate(Model& model, MicroBatchReader& valid, int batches, int micro_batches, int64_t global_batch,
               parallel::Comm& control_dp);

}  // namespace llmtrain::trainer
