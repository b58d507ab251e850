// The pipeline executor across real ranks (stages = world size, stage = rank): a toy model whose
// stage s computes y = a_s·x + b_s elementwise and the last stage the loss ½‖y‖², run with GPipe,
// 1F1B and ZB-H1 (backward split into I and W) for several micro-batch counts, two steps per executor. Every stage's
// recorded forward inputs and input gradients must equal the values computed here directly (no pipeline) — exactly: the
// constants and data are small dyadic numbers, so float arithmetic is exact. The toy stage also enforces the executor's
// memory contract: it poisons a micro-batch's output at its backward, overwrites one shared input-gradient buffer at
// every backward, and checks that the input it was given is unchanged when its backward comes. Activations are 3000
// floats (12 KB), above Open MPI's shared-memory eager limit, so sends complete only once received. Every wait is
// bounded by the world communicator's timeout (30 s in mpi_test_main.cpp): a schedule that deadlocks fails.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/error.h"
#include "parallel/pipeline_executor.h"
#include "tests/parallel/mpi_test_env.h"

namespace llmtrain::parallel {
namespace {

using kernels::host_tensor;
using mpitest::world;

constexpr int64_t kWidth = 3000;

float stage_a(int s) {
  static constexpr float kA[] = {2.0f, 0.5f, -1.0f, 3.0f};
  return kA[s % 4];
}
float stage_b(int s) {
  static constexpr float kB[] = {1.0f, -2.0f, 0.25f, 3.0f};
  return kB[s % 4];
}
// The first stage's input for (step, micro-batch): small integers.
float data(int step, int mb, int64_t i) { return float((i % 7) - 3 + mb + 2 * step); }

class ToyStage final : public PipelineStage {
 public:
  ToyStage(int stage, int stages, int micro_batches)
      : s_(stage),
        p_(stages),
        outputs_(micro_batches, std::vector<float>(kWidth)),
        inputs_(micro_batches),
        saved_(micro_batches),
        input_grads_(micro_batches),
        input_grad_(kWidth) {}

  kernels::Shape activation_shape() const override { return {kWidth}; }
  kernels::DType activation_dtype() const override { return kernels::DType::fp32; }
  kernels::Device activation_device() const override { return kernels::Device::cpu; }

  void forward(int mb, int chunk, Tensor input) override {
    calls.push_back({PipeOpKind::forward, mb, chunk});
    EXPECT_EQ(input.defined(), s_ > 0) << "stage " << s_ << " F" << mb;
    std::vector<float>& x = inputs_[mb];
    x.resize(kWidth);
    if (s_ == 0) {
      for (int64_t i = 0; i < kWidth; ++i) x[i] = data(step, mb, i);
    } else {
      ASSERT_EQ(input.numel(), kWidth);
      const float* in = input.ptr<float>();
      x.assign(in, in + kWidth);
    }
    saved_[mb] = input;
    for (int64_t i = 0; i < kWidth; ++i) outputs_[mb][i] = stage_a(s_) * x[i] + stage_b(s_);
  }

  void backward(int mb, int chunk, Tensor grad_output) override {
    calls.push_back({PipeOpKind::backward, mb, chunk});
    input_gradient(mb, grad_output);
  }
  // ZB-H1: I is the whole backward of this toy (it has no weights); the input stays the stage's
  // until W.
  void backward_input(int mb, int chunk, Tensor grad_output) override {
    calls.push_back({PipeOpKind::backward_input, mb, chunk});
    input_gradient(mb, grad_output);
  }
  void backward_weight(int mb, int chunk) override {
    calls.push_back({PipeOpKind::backward_weight, mb, chunk});
    check_kept_input(mb);
  }

  void check_kept_input(int mb) {
    if (saved_[mb].defined()) {
      const float* kept = saved_[mb].ptr<float>();
      int64_t changed = 0;
      for (int64_t i = 0; i < kWidth; ++i) changed += kept[i] != inputs_[mb][i];
      EXPECT_EQ(changed, 0) << "stage " << s_ << ": the input of micro-batch " << mb << " changed before its backward";
    }
  }

  void input_gradient(int mb, Tensor grad_output) {
    const bool last = s_ == p_ - 1;
    EXPECT_EQ(grad_output.defined(), !last) << "stage " << s_ << " B" << mb;
    check_kept_input(mb);
    // d(½‖y‖²)/dy = y on the last stage.
    const float* dy = last ? outputs_[mb].data() : grad_output.ptr<float>();
    if (!last) {
      EXPECT_EQ(grad_output.numel(), kWidth);
    }
    for (int64_t i = 0; i < kWidth; ++i) input_grad_[i] = stage_a(s_) * dy[i];
    input_grads_[mb] = input_grad_;
    // The output is released at backward: anything still sending it would send NaN.
    std::fill(outputs_[mb].begin(), outputs_[mb].end(), std::numeric_limits<float>::quiet_NaN());
  }

  Tensor output(int mb, int) override { return host_tensor(outputs_[mb].data(), {kWidth}); }
  Tensor input_grad(int, int) override { return host_tensor(input_grad_.data(), {kWidth}); }

  const std::vector<std::vector<float>>& inputs() const { return inputs_; }
  const std::vector<std::vector<float>>& input_grads() const { return input_grads_; }

  int step = 0;
  std::vector<PipeOp> calls;

 private:
  int s_, p_;
  std::vector<std::vector<float>> outputs_;      // per micro-batch, until its backward
  std::vector<std::vector<float>> inputs_;       // copies of what forward got (for the checks)
  std::vector<Tensor> saved_;                    // the executor's input buffers, as a model keeps them
  std::vector<std::vector<float>> input_grads_;  // copies of each backward's input gradient
  std::vector<float> input_grad_;                // ONE buffer, overwritten by every backward
};

// Runs `kind` with m micro-batches for two steps and checks this rank's stage.
void run_case(PipelineSchedule kind, int m) {
  Comm& pp = world();
  const int p = pp.size(), s = pp.rank();
  SCOPED_TRACE(fmt::format("{} with {} stages, {} micro-batches, stage {}", to_string(kind), p, m, s));
  const auto ops = make_schedule(kind, {.stages = p, .stage = s, .micro_batches = m});
  std::vector<PipeOp> compute;
  for (const PipeOp& op : ops)
    if (is_compute(op.kind)) compute.push_back(op);

  ToyStage stage(s, p, m);
  PipeLinks links = make_pipe_links(pp);
  PipelineExecutor ex(ops, stage, links);
  // Receive buffers: none where nothing comes in; otherwise what stays alive plus one posted early.
  if (s == 0) {
    EXPECT_EQ(ex.activation_buffers(), 0);
  } else {
    EXPECT_GE(ex.activation_buffers(), max_in_flight(ops));
    EXPECT_LE(ex.activation_buffers(), max_in_flight(ops) + 1);
  }
  if (s == p - 1) {
    EXPECT_EQ(ex.grad_buffers(), 0);
  } else {
    EXPECT_GE(ex.grad_buffers(), 1);
    EXPECT_LE(ex.grad_buffers(), 2);
  }

  for (int step = 0; step < 2; ++step) {
    stage.step = step;
    stage.calls.clear();
    ex.run();
    EXPECT_EQ(stage.calls, compute);
    for (int mb = 0; mb < m; ++mb) {
      // Directly: the input of every stage, the last output, and ∂(½‖y‖²)/∂x_s = (Π_{k≥s} a_k)·y.
      int64_t bad_inputs = 0, bad_grads = 0;
      for (int64_t i = 0; i < kWidth; ++i) {
        double x = data(step, mb, i), my_input = 0;
        for (int k = 0; k < p; ++k) {
          if (k == s) my_input = x;
          x = double(stage_a(k)) * x + double(stage_b(k));
        }
        double grad = x;
        for (int k = p - 1; k >= s; --k) grad *= double(stage_a(k));
        bad_inputs += double(stage.inputs()[mb][i]) != my_input;
        bad_grads += double(stage.input_grads()[mb][i]) != grad;
      }
      EXPECT_EQ(bad_inputs, 0) << "forward inputs of micro-batch " << mb << " wrong, step " << step;
      EXPECT_EQ(bad_grads, 0) << "input gradients of micro-batch " << mb << " wrong, step " << step;
    }
  }
}

TEST(PipelineExecutorMpi, GPipeMatchesTheDirectComputation) {
  const int p = world().size();
  for (int m : {1, 2, p - 1, p, 2 * p + 1, 8})
    if (m >= 1) run_case(PipelineSchedule::gpipe, m);
}

TEST(PipelineExecutorMpi, OneFOneBMatchesTheDirectComputation) {
  const int p = world().size();
  for (int m : {1, 2, p - 1, p, 2 * p + 1, 8})
    if (m >= 1) run_case(PipelineSchedule::one_f_one_b, m);
}

TEST(PipelineExecutorMpi, ZeroBubbleMatchesTheDirectComputation) {
  const int p = world().size();
  for (int m : {1, 2, p - 1, p, 2 * p + 1, 8})
    if (m >= 1) run_case(PipelineSchedule::zero_bubble, m);
}

}  // namespace
}  // namespace llmtrain::parallel
