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
#include "kernels/buffer.h"
#include "parallel/progress.h"
#include "trainer/checkpoint/checkpointer.h"
#include "trainer/data/gpt_dataset.h"
#include "trainer/data/micro_batches.h"
#include "trainer/data/sampler.h"
#include "trainer/data/tokenizer.h"
#include "trainer/loop/evaluate.h"
#include "trainer/loop/fault_injection.h"
#include "trainer/loop/memory.h"
#include "trainer/loop/step_timer.h"
#include "trainer/loop/stop_agreement.h"
#include "trainer/loop/train_step.h"
#include "trainer/model/model.h"
#include "trainer/model/model_spec.h"
#include "trainer/report/reporter.h"

namespace llmtrain::trainer {
namespace fs = std::filesystem;

namespace {

// The per-rank peak MFU is measured against: log.peak_tflops, else the CPU's theoretical peak with
// this rank's threads, else (kernels/cpu/cpu_peak.cpp says why) its best sgemm rate at this rank's
// matrix products of the model.
// On cuda: the device's rated peak (kernels/gpu_peak.cpp; fp32 CUDA cores for fp32, dense tensor
// cores for 16-bit), or where the table does not know the device (the simulator, which runs on the
// CPU, included) the CPU's as below, saying so.
kernels::CpuPeak peak_flops(const Recipe& r, int threads, int device) {
  if (r.log.peak_tflops > 0)
    return {r.log.peak_tflops * 1e12, fmt::format("{} TFLOP/s (log.peak_tflops)", r.log.peak_tflops)};
  std::string unknown_gpu;
  if (r.train.device == DeviceKind::cuda) {
    const kernels::CudaInfo cuda = kernels::cuda_info();
    const size_t held = device >= 0 ? size_t(device) : 0;  // the device this rank holds
    const std::string name = held < cuda.devices.size() ? cuda.devices[held].name : "";
    const std::optional<kernels::GpuPeak> gpu = kernels::gpu_peak_lookup(name);
    const bool wide = r.train.precision == Precision::fp32;
    if (gpu && (wide ? gpu->fp32 : gpu->bf16_dense) > 0) {
      const double flops = wide ? gpu->fp32 : gpu->bf16_dense;
      return {flops, fmt::format("{} rated {} TFLOP/s ({})", gpu->model, flops / 1e12,
                                 wide ? "fp32, CUDA cores" : "16-bit dense tensor cores")};
    }
    unknown_gpu = cuda.simulator
                      ? " (the CPU's: the CUDA simulator runs on it)"
                      : fmt::format(" (the CPU's: no rated peak for CUDA device '{}'; set log.peak_tflops)", name);
  }
  const ModelConfig& mc = r.model;
  const int64_t rows = int64_t(r.train.micro_batch) * mc.seq_len, d = mc.hidden, f = mc.ffn_hidden, tp = r.parallel.tp;
  kernels::CpuPeak peak =
      kernels::cpu_peak(threads, {{rows, (mc.heads + 2 * mc.kv_heads) * int64_t(mc.head_size()) / tp, d},
                                  {rows, f / tp, d},
                                  {rows, d, f / tp},
                                  {rows, mc.padded_vocab() / tp, d}});
  peak.how += unknown_gpu;
  return peak;
}

// The header's devices: rank 0's in full, and every rank's ordinal (each chose its own from its
// local rank, kernels/device_select.h). Collective on `world`: every rank calls it.
void log_devices(const TrainContext& ctx, parallel::Comm& world) {
  int32_t mine = ctx.device;
  std::vector<int32_t> all(size_t(world.size()), -1);
  world.all_gather(kernels::Tensor(&mine, kernels::DType::int32, {1}),
                   kernels::Tensor(all.data(), kernels::DType::int32, {int64_t(all.size())}));
  log_progress("device: rank 0 holds {}", ctx.device_text);
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
  if (r.train.device == DeviceKind::cuda) {
    const kernels::CudaInfo cuda = kernels::cuda_info();
    if (!cuda.built)
      throw Error(fmt::format("this build has no CUDA backend: train.device is cuda ({})", cuda.unavailable_reason),
                  "build with -DLLMTRAIN_CUDA=ON (a GPU) or SIM (the simulator), or set train.device: cpu");
    if (cuda.devices.empty())
      throw Error(fmt::format("train.device is cuda, but no CUDA device is usable here ({})", cuda.unavailable_reason),
                  "run on a machine with an NVIDIA GPU (`llmtrain env` lists what this one has), or set "
                  "train.device: cpu");
  }

  FileSystem& fsys = ctx.fs ? *ctx.fs : default_file_system();
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
  const Layout layout = layout_of(r);  // read by the model's options, the step (its gradient sync) and memory_plan
  std::vector<parallel::PipeOp> schedule = step_schedule(layout, ctx.mesh->coord().pp, accum);
  Model model(mc, step_model_options(r, layout, ctx.mesh->coord().pp, schedule), *comms.tp,
              layout.cp > 1 ? comms.cp.get() : nullptr, layout.ep > 1 ? comms.ep.get() : nullptr);
  TrainStep step(r, layout, model, comms, train_batches, std::move(schedule));
  StepTimer timer(model.device(), step.schedule());
  step.set_observer(&timer);
  model.init_parameters(r.train.seed);  // after the step: at ZeRO 3 the values live in its shard
  step.master_from_params();            // 16-bit parameters: the optimizer's fp32 master
  log_progress("model: {} parameters on this rank; memory per rank: {}", format_count(double(model.numel())),
               format_memory(memory_plan(r, layout, ctx.mesh->coord())));
  if (const OffloadStore* store = step.optimizer().offload_store()) {
    const AdamW& adamw = step.optimizer();
    std::string update = "AdamW a unit at a time";
    if (adamw.updates_on_cpu())
      update = adamw.params_offloaded() ? "AdamW on the CPU (gradients copied down; the values stay there)"
                                        : "AdamW on the CPU (gradients copied down, updated values up)";
    else if (model.device() == kernels::Device::cuda)
      update = "AdamW on the device, a unit at a time";
    log_progress("optimizer state offloaded (parallel.offload {}): {} in {}, moved in {} unit(s) of {} elements; {}",
                 to_string(r.parallel.offload),
                 format_bytes(double(store->units() * store->unit() * store->arrays()) * sizeof(float)), store->where(),
                 store->units(), store->unit(), update);
  }
  const Fault fault = fault_from_env();
  const std::unique_ptr<FileSystem> fault_fs = fault_file_system(fault, world.rank(), fsys);  // tests only
  // dp × cp replicas hold the same slices: the first writes them.
  Checkpointer checkpoints(r, ctx.recipe_yaml, *tokenizer, model, step, comms.replicas().rank(), world,
                           fault_fs ? *fault_fs : fsys, data_identity(train_data));
  checkpoints.set_writer_hook(fault_writer_hook(fault, world.rank(), r.checkpoint.async));  // tests only
  RunPosition at = checkpoints.resume();
  if (at.step >= r.train.steps) {
    log_progress("nothing to do: the checkpoint is at step {} and train.steps is {}", at.step, r.train.steps);
    return kExitOk;
  }

  const kernels::CpuPeak rank_peak = peak_flops(r, ctx.threads, ctx.device);
  const double peak = rank_peak.flops * world.size();
  log_progress(
      "{} steps of {} sequences × {} tokens ({} micro-batches of {} per data-parallel rank); MFU against {} "
      "rank(s) × {}",
      r.train.steps, r.train.global_batch, mc.seq_len, accum, r.train.micro_batch, world.size(), rank_peak.how);
  Reporter report(r, world, at.step, training_flops_per_token(mc), peak, comms.replicas().size());
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
    outcome.times.forward += fault_slow_down(fault, at.step, world.rank(), outcome.times.compute());  // tests only
    report.step_done(at.step, outcome, step.grad_sync().stats());
    if (at.step == report.start_step() + 1)
      log_progress("memory per rank, measured after the first step: {}",
                   format_memory(memory_measured(model.device(), true)));
    const bool last = at.step == r.train.steps;
    report.checkpoint_done(checkpoints.step_boundary(at.step));  // checkpoint.async: commits a finished save
    if (r.eval.every > 0 && at.step % r.eval.every == 0 && !last) eval();
    if (r.checkpoint.every > 0 && at.step % r.checkpoint.every == 0 && !last)
      report.checkpoint_done(checkpoints.save(at));
    fault_maybe_fire(fault, at.step, world.rank());  // tests of failure handling only
    if (fault_offload_io_error(fault, at.step, world.rank())) {
      if (!step.optimizer().offload_store())
        throw Error("LLMTRAIN_FAULT=offload-io-error without an offload file", "set parallel.offload: nvme");
      step.optimizer().offload_store()->inject_write_error();
    }
    checkpoints.keep_lock();

    // Stop on SIGTERM/SIGINT: every rank agrees, checkpoints this step, and exits 75.
    if (stop_agreed(world) && !last) {
      report.end_line();
      log_progress("stop requested (signal): writing a checkpoint at step {}", at.step);
      checkpoints.save_final(at);  // after the save in flight, if any (checkpoint.async)
      remove_stop_handlers();
      log_progress("interrupted at step {} of {}; resume with the same command", at.step, r.train.steps);
      return kExitInterrupted;
    }
  }
  report.end_line();
  if (last_eval != at.step) eval();
  checkpoints.save_final(at);
  remove_stop_handlers();
  log_progress("done: {} steps in {}", r.train.steps, format_duration(report.elapsed_s()));
  if (comms.pp->size() > 1 && !timer.schedule_times().empty())  // every rank ran the same steps
    report_pipeline_idle(r, accum, timer, *comms.control.pp);
  if (const OffloadStore* store = step.optimizer().offload_store(); store && r.parallel.offload == OffloadKind::nvme) {
    const OffloadStore::Stats io = store->stats();
    log_progress(
        "offload file: {} read, {} written; I/O busy {}, the steps waited {} for it ({:.0f}% hidden behind "
        "the updates)",
        format_bytes(double(io.read_bytes)), format_bytes(double(io.written_bytes)), format_duration(io.io_s),
        format_duration(io.waited_s), io.io_s > 0 ? 100.0 * std::max(0.0, 1.0 - io.waited_s / io.io_s) : 0.0);
  }
  if (const OffloadStore* store = step.optimizer().offload_store(); store && step.optimizer().updates_on_cpu()) {
    const TrainStep::EarlyCopies& c = step.early_copies();
    log_progress(
        "offload host: the last update found {} of {} units' gradients copied down during backward, {} "
        "more as their reductions completed after it; {}",
        c.in_backward, store->units(), c.before_update - c.in_backward,
        step.updates_during_backward()
            ? fmt::format("{} updated on the CPU by the time the step reached its update (each as its "
                          "gradients arrived, beside backward)",
                          c.updated_early)
            : std::string("the CPU update waits for the gradient norm (clipping, loss scaling or "
                          "train.on_nonfinite: skip)"));
  }
  log_progress("memory per rank, peaks over the run: {}; peak of all kinds at once {}",
               format_memory(memory_measured(model.device(), true)),
               format_bytes(double(kernels::memory_use(model.device()).peak)));
  return kExitOk;
}

}  // namespace llmtrain::trainer
