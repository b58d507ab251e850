// The training step on the simulated CUDA device (trainer/loop/train_step.h, kernels/cuda/sim/):
// without an observer a warm step makes the host wait for the device once, to read its scalars —
// the micro-batch losses and the parts of the gradient norm (trainer/optim/optimizer.h), in one
// copy — and never synchronizes the device; with the timer
// (trainer/loop/step_timer.h) its phases and ops are timed by events.
#include "kernels/cuda/sim/sim_counters.h"
#include "tests/trainer/loop/train_step_fixture.h"
#include "trainer/loop/micro_batch_upload.h"
#include "trainer/loop/step_timer.h"

namespace llmtrain::trainer {
namespace {

// What a warm fp32 step of the fixture's LLaMA (4 micro-batches) launches, per transformer block and
// besides: a block's forward and backward, 27 per micro-batch; besides them the embedding, head and
// loss per micro-batch and, once a step whatever the model's size, the gradient norm's parts (2:
// sum_squares_chunks) and AdamW (1: adamw_rows). A change that adds or removes launches updates these
// with its reason (docs/cuda.md, "Launches and host waits"): 51 → 59 when the embedding's backward
// became a sort and segment sums (4 launches a micro-batch, was 2: token chains and a thread per
// column walking every row).
constexpr int64_t kLaunchesPerBlock = 108, kLaunchesOutsideBlocks = 59;

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
  EXPECT_EQ(after.pageable_uploads - before.pageable_uploads, 0)
      << "micro-batches reach the device from pinned memory, without waiting for the device";

  StepTimer timer(one.model.device(), one.step->schedule());
  one.step->set_observer(&timer);
  const StepOutcome timed = one.step->run(2, 2 * recipe_.train.global_batch);
  EXPECT_GT(timed.times.forward, 0);
  EXPECT_GT(timed.times.backward, 0);
  EXPECT_GT(timed.times.optimizer, 0);
  EXPECT_EQ(timer.op_times().size(), timer.compute_ops());
  EXPECT_EQ(timer.schedule_times().size(), 1u);
}

// Kernel launches of a warm step (the host's launch overhead on a GPU), deterministic on the
// simulator: the same every step, and a fixed count per transformer block.
TEST_F(TrainStepTest, LaunchesPerStepAreFixedPerBlock) {
  recipe_.train.device = DeviceKind::cuda;
  auto launches = [&](int layers) {
    recipe_.model.layers = layers;
    Rank one(recipe_, prefix_, parallel::make_local_comm(), 1);
    one.step->run(0, 0);
    std::vector<int64_t> per_step;
    for (int s = 1; s <= 2; ++s) {
      const int64_t before = cuda_sim::kernel_launches();
      one.step->run(s, s * recipe_.train.global_batch);
      per_step.push_back(cuda_sim::kernel_launches() - before);
    }
    EXPECT_EQ(per_step[0], per_step[1]) << layers << " layers: launches differ between warm steps";
    return per_step[0];
  };
  const int64_t two = launches(2), four = launches(4);
  const int64_t per_block = (four - two) / 2, rest = two - 2 * per_block;
  std::printf("kernel launches per step: %lld = %lld + %lld per block (4 micro-batches of 2 × 12 tokens)\n",
              (long long)two, (long long)rest, (long long)per_block);
  EXPECT_EQ(four - two, 2 * per_block);
  EXPECT_EQ(per_block, kLaunchesPerBlock);
  EXPECT_EQ(rest, kLaunchesOutsideBlocks);
}

// The pinned upload slots (trainer/loop/micro_batch_upload.h) with one slot: the second micro-batch
// refills the slot only after the device has copied the first out of it. The simulator runs stream
// work late, when the host needs it, so a refill that did not wait would show in the first copy.
TEST(MicroBatchUploadSim, ASlotIsRefilledOnlyAfterTheDeviceCopiedIt) {
  MicroBatchUpload upload(kernels::Device::cuda, 1, 60.0);
  std::vector<int32_t> a(24), b(24);
  for (int i = 0; i < 24; ++i) a[size_t(i)] = i, b[size_t(i)] = 100 + i;
  kernels::Buffer first(kernels::DType::int32, {24}, kernels::Device::cuda);
  kernels::Buffer second(kernels::DType::int32, {24}, kernels::Device::cuda);
  const cuda_sim::HostWaits before = cuda_sim::host_waits();
  for (const auto& [host, device] : {std::pair{&a, &first}, std::pair{&b, &second}}) {
    const MicroBatch staged = upload.stage({kernels::host_tensor(host->data(), {2, 12}), {}});
    EXPECT_FALSE(staged.targets.defined());
    kernels::copy(device->tensor(), staged.tokens.view({24}));
    upload.used();
  }
  EXPECT_EQ(cuda_sim::host_waits().pageable_uploads - before.pageable_uploads, 0);
  std::vector<int32_t> got(24);
  kernels::copy(kernels::host_tensor(got.data(), {24}), first.tensor());
  EXPECT_EQ(got, a);
  kernels::copy(kernels::host_tensor(got.data(), {24}), second.tensor());
  EXPECT_EQ(got, b);
}

}  // namespace
}  // namespace llmtrain::trainer
