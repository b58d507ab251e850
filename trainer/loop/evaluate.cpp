#include "trainer/loop/evaluate.h"

#include "common/error.h"
#include "kernels/buffer.h"
#include "kernels/ops.h"
#include "parallel/progress.h"

namespace llmtrain::trainer {

namespace {

// One stage's share of the pipelined forward of every micro-batch; the sum of their losses on the
// last stage (0 elsewhere).
double pipelined_loss_sum(Model& model, MicroBatchReader& valid, int batches, int micro_batches, int64_t global_batch,
                          parallel::Comm& pp) {
  const StageLayout& st = model.options().stage;
  const int64_t hidden = model.config().hidden;
  // A full micro-batch's stage input; with sequence parallelism (rank 2: this tp rank's rows) every
  // micro-batch is full.
  const kernels::Shape shape = model.stage_activation_shape();
  // In the storage dtype, as the stages send it (TrainStep's pipeline messages too).
  kernels::Buffer input(model.options().dtype, shape, model.device(), kernels::MemoryKind::communication);
  double sum = 0;
  for (int b = 0; b < batches; ++b)
    for (int m = 0; m < micro_batches; ++m) {
      const MicroBatch mb = valid.read(int64_t(b) * global_batch, m);
      const int64_t rows = mb.tokens.shape[0], cols = mb.tokens.shape[1];
      // Virtual chunks (the interleaved schedule): the micro-batch passes every stage once per
      // chunk, chunk 0 of the first stage to the last chunk of the last stage, around the ring.
      for (int c = 0; c < st.chunks; ++c) {
        const bool first = st.has_embedding && c == 0, last = st.has_head && c == st.chunks - 1;
        kernels::Tensor in;
        if (!first) {
          in = shape.rank() == 2 ? input.tensor()
                                 : input.tensor().flat(0, rows * cols * hidden).view({rows, cols, hidden});
          pp.recv(in, (pp.rank() + pp.size() - 1) % pp.size(), kEvalActivationTag);
        }
        model.stage_forward(0, mb, in, c);
        parallel::beat_progress();  // a long evaluation is not a hang (parallel/progress.h)
        if (!last) {
          pp.send(model.stage_output(0, c), (pp.rank() + 1) % pp.size(), kEvalActivationTag);
        } else {
          float loss = 0;
          kernels::copy(kernels::host_tensor(&loss, {1}), model.loss(0));
          sum += loss;
        }
      }
    }
  return sum;
}

}  // namespace

float evaluate(Model& model, MicroBatchReader& valid, int batches, int micro_batches, int64_t global_batch,
               parallel::Comm& control_dp, parallel::Comm* pp, parallel::Comm* control_pp) {
  const bool pipelined = pp && pp->size() > 1;
  LT_CHECK(!pipelined || control_pp, "pipelined evaluation without the pp control group");
  double sum = 0;
  if (pipelined)
    sum = pipelined_loss_sum(model, valid, batches, micro_batches, global_batch, *pp);
  else
    for (int b = 0; b < batches; ++b)
      for (int m = 0; m < micro_batches; ++m) {
        sum += model.forward_loss(valid.read(int64_t(b) * global_batch, m));
        parallel::beat_progress();
      }
  float mean = float(sum / (double(batches) * micro_batches));
  if (pipelined) control_pp->broadcast(kernels::host_tensor(&mean, {1}), control_pp->size() - 1);
  control_dp.all_reduce(kernels::host_tensor(&mean, {1}), parallel::ReduceOp::avg);
  return mean;
}

}  // namespace llmtrain::trainer
