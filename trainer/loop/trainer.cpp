#include "trainer/loop/trainer.h"

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "common/signals.h"
#include "common/strings.h"
#include "kernels/backend_info.h"
#include "parallel/progress.h"
#include "trainer/checkpoint/checkpointer.h"
#include "trainer/data/gpt_dataset.h"
#include "trainer/data/micro_batches.h"
#include "trainer/data/sampler.h"
#include "trainer/data/tokenizer_load.h"
#include "trainer/loop/evaluate.h"
#include "trainer/loop/fault_injection.h"
#include "trainer/loop/op_profiler.h"
#include "trainer/loop/run_observer.h"
#include "trainer/loop/run_report.h"
#include "trainer/loop/step_timer.h"
#include "trainer/loop/stop_agreement.h"
#include "trainer/loop/train_step.h"
#include "trainer/model/model.h"
#include "trainer/placement/memory.h"

namespace llmtrain::trainer {
namespace fs = std::filesystem;

namespace {

// train.device: cuda needs a build with a CUDA backend and a device it can use.
void require_cuda_device() {
  const kernels::CudaInfo cuda = kernels::cuda_info();
  if (!cuda.built)
    throw Error(fmt::format("this build has no CUDA backend: train.device is cuda ({})", cuda.unavailable_reason),
                "build with -DLLMTRAIN_CUDA=ON (a GPU) or SIM (the simulator), or set train.device: cpu");
  if (cuda.devices.empty())
    throw Error(fmt::format("train.device is cuda, but no CUDA device is usable here ({})", cuda.unavailable_reason),
                "run on a machine with an NVIDIA GPU (`llmtrain env` lists what this one has), or set "
                "train.device: cpu");
}

// The header's devices: rank 0's in full, and every rank's ordinal (each chose its own from its
// local rank, kernels/device_select.h). Collective on `world`: every rank calls it.
void log_devices(const TrainContext& ctx, parallel::Comm& world) {
  int32_t mine = ctx.device;
  std::vector<int32_t> all(size_t(world.size()), -1);
  world.all_gather(kernels::Tensor(&mine, kernels::DType::int32, {1}),
                   kernels::Tensor(all.data(), kernels::DType::int32, {int64_t(all.size())}));
  log_progress("device: rank 0 holds {}", ctx.device_text);
  const ModelConfig& mc = ctx.recipe->model;
  log_progress("attention: {}",
               kernels::cuda_attention_kernel(precision_dtype(ctx.recipe->train.precision), mc.head_size()));
  if (world.size() == 1) return;
  if (!ctx.device_comm_text.empty()) log_progress("device communication: {}", ctx.device_comm_text);
  std::vector<std::string> ranks;
  for (size_t i = 0; i < all.size() && i < 64; ++i) ranks.push_back(fmt::format("{}:cuda:{}", i, all[i]));
  if (all.size() > 64) ranks.push_back(fmt::format("... ({} ranks)", all.size()));
  log_progress("devices by rank: {}", join(ranks, " "));
}

// The run directory: the resolved recipe and the log. Rank 0 writes; the others log to stderr.
void open_run_directory(const Recipe& r, const std::string& recipe_yaml, FileSystem& fsys) {
  fsys.make_dirs(r.log.dir);
  write_file_atomic(fsys, (fs::path(r.log.dir) / "recipe.yaml").string(), recipe_yaml);
  log_open_file((fs::path(r.log.dir) / "train.log").string());
}

}  // namespace

int train(const TrainContext& ctx) {
  const Recipe& r = *ctx.recipe;
  const ModelConfig& mc = r.model;
  parallel::MeshComms& comms = *ctx.comms;
  parallel::Comm& world = *comms.control.world;
  const bool root = world.rank() == 0;
  log_set_progress(root);
  kernels::set_cpu_threads(ctx.threads);
  if (r.train.device == DeviceKind::cuda) require_cuda_device();

  FileSystem& fsys = ctx.fs ? *ctx.fs : default_file_system();
  // The checkpoint directory's lock before anything is written: a run it refuses writes nothing.
  std::unique_ptr<CheckpointDirLock> ckpt_lock = checkpoint_dir_lock(r.checkpoint.dir, world);
  if (root) open_run_directory(r, ctx.recipe_yaml, fsys);
  log_progress("llmtrain run {}: {} rank(s) = {}, {} thread(s) per rank", r.name, world.size(),
               parallel::Mesh::describe(ctx.mesh->shape()), ctx.threads);
  if (ctx.device >= 0) log_devices(ctx, world);

  // Data: this data-parallel rank's share of every global batch.
  parallel::set_progress(0, parallel::Phase::load);
  auto tokenizer = load_tokenizer(r.data.tokenizer);
  GptDataset train_data(r.data.train, mc.seq_len, r.train.seed, mc.vocab);
  std::optional<GptDataset> valid_data;
  if (!r.data.valid.empty())
    valid_data.emplace(std::vector<DataSource>{{r.data.valid, 1.0}}, mc.seq_len, r.train.seed, mc.vocab);
  log_progress("data: {}", train_data.describe());
  const Sampler sampler(r.train.global_batch, r.train.micro_batch, comms.dp->rank(), comms.dp->size());
  const int accum = sampler.micro_batches_per_step();
  // Context parallelism: the cp ranks of a dp rank read the same samples, each keeping its two chunks.
  const ContextSplit split{comms.cp->size(), comms.cp->rank()};
  MicroBatchReader train_batches(train_data, sampler, mc.seq_len, split);
  std::optional<MicroBatchReader> valid_batches;
  if (valid_data) valid_batches.emplace(*valid_data, sampler, mc.seq_len, split);

  // Model, the step (gradient sync and optimizer) and checkpoints.
  LT_CHECK(ctx.placement, "train() needs the rank's placement in its context");
  const Placement& placement = *ctx.placement;
  const Layout& layout = placement.layout;
  LT_CHECK(accum == r.grad_accum_steps(), "{} micro-batches a step, the recipe's {}", accum, r.grad_accum_steps());
  Model model(mc, placement.model, *comms.tp, layout.cp > 1 ? comms.cp.get() : nullptr,
              layout.ep > 1 ? comms.ep.get() : nullptr);
  TrainStep step(r, placement, model, comms, train_batches);
  StepTimer timer(model.device(), step.schedule());
  OpProfiler profile(r.log, model.device());  // log.profile: ops; else not set
  StepObservers step_observers{&timer, profile.enabled() ? &profile : nullptr};
  step.set_observer(&step_observers);
  model.init_parameters(r.train.seed);  // after the step: at ZeRO 3 the values live in its shard
  step.master_from_params();            // 16-bit parameters: the optimizer's fp32 master
  log_progress("model: {} parameters on this rank; memory per rank: {}", format_count(double(model.numel())),
               format_memory(memory_account(placement)));
  log_offload(r, step.optimizer(), model.device());
  // LLMTRAIN_FAULT, for the tests of failure handling: the checkpoints' file system and writer hook.
  FaultInjector faults(world.rank(), step.optimizer().offload_store());
  // dp × cp replicas hold the same slices: the first writes them.
  Checkpointer checkpoints(r, ctx.recipe_yaml, *tokenizer, model, step, comms.replicas().rank(), world,
                           faults.file_system(fsys), std::move(ckpt_lock), data_identity(train_data));
  checkpoints.set_writer_hook(faults.writer_hook(r.checkpoint.async));
  checkpoints.set_allowed_changes(ctx.allowed_changes);
  RunPosition at = checkpoints.resume();
  if (at.step >= r.train.steps) {
    log_progress("nothing to do: the checkpoint is at step {} and train.steps is {}", at.step, r.train.steps);
    return kExitOk;
  }

  RunReport report(ctx, step, model.device(), timer, profile, fsys, at.step, accum);
  RunObservers observers{&faults, &report};  // in this order: a slow fault's sleep is reported
  int64_t last_eval = -1;
  auto eval = [&] {  // its buffers live only while it runs: training's memory is not evaluation's
    if (!valid_batches) return;
    parallel::set_progress(at.step, parallel::Phase::eval);
    report.eval_done(
        at.step,
        Evaluator(model, *valid_batches, r.eval.batches, accum, r.train.global_batch, step.schedule(), comms).run());
    parallel::set_progress(at.step, parallel::Phase::train);
    last_eval = at.step;
  };
  install_stop_handlers();
  parallel::set_progress(at.step, parallel::Phase::train);

  while (at.step < r.train.steps) {
    StepOutcome outcome = step.run(at.step, at.consumed_samples);
    at = {at.step + 1, at.consumed_samples + r.train.global_batch};
    parallel::set_progress(at.step, parallel::Phase::train);
    observers.step_done(at.step, outcome);
    const bool last = at.step == r.train.steps;
    report.checkpoint_done(checkpoints.step_boundary(at.step));  // checkpoint.async: commits a finished save
    if (r.eval.every > 0 && at.step % r.eval.every == 0 && !last) eval();
    if (r.checkpoint.every > 0 && at.step % r.checkpoint.every == 0 && !last)
      report.checkpoint_done(checkpoints.save(at));
    observers.step_boundary(at.step);
    checkpoints.keep_lock();

    // Stop on SIGTERM/SIGINT: every rank agrees, checkpoints this step, and exits 75.
    if (stop_agreed(world) && !last) {
      report.end_line();
      log_progress("stop requested (signal): writing a checkpoint at step {}", at.step);
      checkpoints.save_final(at);  // after the save in flight, if any (checkpoint.async)
      remove_stop_handlers();
      observers.run_end(at.step, RunEnd::interrupted);
      log_progress("interrupted at step {} of {}; resume with the same command", at.step, r.train.steps);
      return kExitInterrupted;
    }
  }
  report.end_line();
  if (last_eval != at.step) eval();
  checkpoints.save_final(at);
  remove_stop_handlers();
  observers.run_end(at.step, RunEnd::done);
  return kExitOk;
}

}  // namespace llmtrain::trainer
