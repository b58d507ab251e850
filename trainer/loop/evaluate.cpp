#include "trainer/loop/evaluate.h"

#include "common/error.h"
#include "kernels/ops.h"
#include "parallel/pipeline_executor.h"
#include "parallel/progress.h"

namespace llmtrain::trainer {

using kernels::Tensor;

// The model as the executor sees it during evaluation: a forward of one micro-batch and chunk at a
// time, in activation slot 0, reading its samples where the training stage does (the first chunk and
// the head) and keeping the loss on the last stage.
class Evaluator::Stage final : public parallel::PipelineStage {
 public:
  Stage(Model& model, MicroBatchReader& valid, Tensor losses) : model_(model), valid_(valid), losses_(losses) {}

  void begin_batch(int64_t consumed_samples) { consumed_ = consumed_samples; }

  kernels::Shape activation_shape() const override { return model_.stage_activation_shape(); }
  kernels::DType activation_dtype() const override { return model_.options().dtype; }
  kernels::Device activation_device() const override { return model_.device(); }

  void forward(int micro_batch, int chunk, Tensor input) override {
    const StageLayout& st = model_.options().stage;
    const bool head = st.has_head && chunk == st.chunks - 1;
    const MicroBatch mb = chunk == 0 || head ? valid_.read(consumed_, micro_batch) : MicroBatch{};
    model_.stage_forward(0, mb, input, chunk);
    parallel::beat_progress();  // a long evaluation is not a hang (parallel/progress.h)
    if (head) kernels::copy(losses_.flat(micro_batch, 1), model_.loss(0));
  }
  void backward(int micro_batch, int chunk, Tensor) override {
    LT_CHECK(false, "evaluation runs no backward (B{} chunk {})", micro_batch, chunk);
  }
  Tensor output(int, int chunk) override { return model_.stage_output(0, chunk); }
  Tensor input_grad(int, int) override { return Tensor{}; }

 private:
  Model& model_;
  MicroBatchReader& valid_;
  Tensor losses_;
  int64_t consumed_ = 0;
};

Evaluator::Evaluator(Model& model, MicroBatchReader& valid, int batches, int micro_batches, int64_t global_batch,
                     const std::vector<parallel::PipeOp>& schedule, parallel::MeshComms& comms)
    : batches_(batches), micro_batches_(micro_batches), global_batch_(global_batch), comms_(comms) {
  losses_ = kernels::Buffer(kernels::DType::fp32, {micro_batches}, model.device());
  losses_host_.assign(size_t(micro_batches), 0.0f);
  stage_ = std::make_unique<Stage>(model, valid, losses_.tensor());
  executor_ =
      std::make_unique<parallel::PipelineExecutor>(parallel::forward_only_schedule(schedule), *stage_, comms.pipe);
}

Evaluator::~Evaluator() = default;

float Evaluator::run() {
  const bool last = comms_.pp->rank() == comms_.pp->size() - 1;
  double sum = 0;
  for (int b = 0; b < batches_; ++b) {
    stage_->begin_batch(int64_t(b) * global_batch_);
    executor_->run();
    if (!last) continue;
    kernels::copy(kernels::host_tensor(losses_host_.data(), {micro_batches_}), losses_.tensor());
    for (float l : losses_host_) sum += l;
  }
  float mean = float(sum / (double(batches_) * micro_batches_));
  if (comms_.pp->size() > 1)
    comms_.control.pp->broadcast(kernels::host_tensor(&mean, {1}), comms_.control.pp->size() - 1);
  comms_.control.replicas().all_reduce(kernels::host_tensor(&mean, {1}), parallel::ReduceOp::avg);
  return mean;
}

}  // namespace llmtrain::trainer
