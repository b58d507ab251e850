// The training step on the simulated CUDA device (trainer/loop/train_step.h, kernels/cuda/sim/):
// without an observer a warm step makes the host wait for the device once, to read its scalars —
// the micro-batch losses and the parts of the gradient norm (trainer/optim/optimizer.h), in one
// copy — and never synchronizes the device; with the timer
// (trainer/loop/step_timer.h) its phases and ops are timed by events.
#include "kernels/cuda/sim/sim_counters.h"
#include "tests/trainer/loop/train_step_fixture.h"
#include "trainer/loop/step_timer.h"

namespace llmtrain::trainer {
namespace {

TEST_F(TrainStepTest, AStepWithoutItsObserverWaitsOnlyForItsScalars) {
  recipe_.train.device = DeviceKind::cuda;
  Rank one(recipe_, prefix_, parallel::make_local_comm(), 1);
  ASSERT_EQ(one.model.device(), kernels::Device::cuda);
  one.step->run(0, 0);
  const cuda_sim::HostWaits before = cuda_sim::host_waits();
  one.step->run(1, recipe_.train.global_batch);
  const cuda_sim::HostWaits after = cuda_sim::host_waits();
  EXPECT_EQ(after.synchronizations - before.synchronizations, 0);
  EXPECT_EQ(after.reads - before.reads, 1) << "the losses and the gradient norm's parts, in one copy";

  StepTimer timer(one.model.device(), one.step->schedule());
  one.step->set_observer(&timer);
  const StepOutcome timed = one.step->run(2, 2 * recipe_.train.global_batch);
  EXPECT_GT(timed.times.forward, 0);
  EXPECT_GT(timed.times.backward, 0);
  EXPECT_GT(timed.times.optimizer, 0);
  EXPECT_EQ(timer.op_times().size(), timer.compute_ops());
  EXPECT_EQ(timer.schedule_times().size(), 1u);
}

}  // namespace
}  // namespace llmtrain::trainer
