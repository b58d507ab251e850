#include "trainer/evaluate.h"

namespace llmtrain::trainer {

float evaluate(Model& model, MicroBatchReader& valid, int batches, int micro_batches, int64_t global_batch,
               parallel::Comm& control_dp) {
  double sum = 0;
  for (int b = 0; b < batches; ++b)
    for (int m = 0; m < micro_batches; ++m) sum += model.forward_loss(valid.read(int64_t(b) * global_batch, m));
  float mean = float(sum / (double(batches) * micro_batches));
  control_dp.all_reduce(kernels::host_tensor(&mean, {1}), parallel::ReduceOp::avg);
  return mean;
}

}  // namespace llmtrain::trainer
