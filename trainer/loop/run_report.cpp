#include "trainer/loop/run_report.h"

#include <algorithm>
#include <optional>
#include <string>

#include "common/log.h"
#include "common/strings.h"
#include "kernels/backend_info.h"
#include "kernels/buffer.h"
#include "trainer/model/model_spec.h"
#include "trainer/optim/offload.h"
#include "trainer/placement/memory.h"

namespace llmtrain::trainer {

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

// The end of a run with offloaded state: the file's traffic (nvme), or how the CPU update met
// backward (an update on the CPU).
void log_offload_traffic(const Recipe& r, TrainStep& step) {
  const OffloadStore* store = step.optimizer().offload_store();
  if (!store) return;
  if (r.parallel.offload == OffloadKind::nvme) {
    const OffloadStore::Stats io = store->stats();
    log_progress(
        "offload file: {} read, {} written; I/O busy {}, the steps waited {} for it ({:.0f}% hidden behind "
        "the updates)",
        format_bytes(double(io.read_bytes)), format_bytes(double(io.written_bytes)), format_duration(io.io_s),
        format_duration(io.waited_s), io.io_s > 0 ? 100.0 * std::max(0.0, 1.0 - io.waited_s / io.io_s) : 0.0);
  }
  if (step.optimizer().updates_on_cpu()) {
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
}

}  // namespace

void log_offload(const Recipe& r, const AdamW& adamw, kernels::Device device) {
  const OffloadStore* store = adamw.offload_store();
  if (!store) return;
  std::string update = "AdamW a unit at a time";
  if (adamw.updates_on_cpu())
    update = adamw.params_offloaded() ? "AdamW on the CPU (gradients copied down; the values stay there)"
                                      : "AdamW on the CPU (gradients copied down, updated values up)";
  else if (device == kernels::Device::cuda)
    update = "AdamW on the device, a unit at a time";
  log_progress("optimizer state offloaded (parallel.offload {}): {} in {}, moved in {} unit(s) of {} elements; {}",
               to_string(r.parallel.offload),
               format_bytes(double(store->units() * store->unit() * store->arrays()) * sizeof(float)), store->where(),
               store->units(), store->unit(), update);
}

RunReport::RunReport(const TrainContext& ctx, TrainStep& step, kernels::Device device, const StepTimer& timer,
                     const OpProfiler& profile, FileSystem& fs, int64_t start_step, int micro_batches)
    : recipe_(*ctx.recipe),
      comms_(*ctx.comms),
      step_(step),
      device_(device),
      timer_(timer),
      profile_(profile),
      fs_(fs),
      micro_batches_(micro_batches),
      rank_peak_(peak_flops(recipe_, ctx.threads, ctx.device)),
      reporter_(recipe_, *comms_.control.world, start_step, training_flops_per_token(recipe_.model),
                rank_peak_.flops * comms_.control.world->size(), comms_.replicas().size()) {
  const Recipe& r = recipe_;
  // The peak MFU is measured against: one rank's derivation, and the job's when it has several
  // ("2 ranks × 131 GFLOP/s = 262 GFLOP/s, each rank 1 core × 32 FLOP/cycle × 4.09 GHz = 131 ...").
  const int ranks = comms_.control.world->size();
  const std::string against =
      ranks == 1 ? rank_peak_.how
                 : fmt::format("{} ranks × {} = {}, each rank {}", ranks, kernels::format_rate(rank_peak_.flops),
                               kernels::format_rate(rank_peak_.flops * ranks), rank_peak_.how);
  log_progress("{} steps of {} sequences × {} tokens ({} micro-batches of {} per data-parallel rank); MFU against {}",
               r.train.steps, r.train.global_batch, r.model.seq_len, micro_batches, r.train.micro_batch, against);
}

void RunReport::step_done(int64_t step, StepOutcome& outcome) {
  reporter_.step_done(step, outcome, step_.grad_sync().stats());
  if (step == reporter_.start_step() + 1)
    log_progress("memory per rank, measured after the first step: {}", format_memory(memory_measured(device_, true)));
}

void RunReport::run_end(int64_t step, RunEnd end) {
  const int rank = comms_.control.world->rank();
  if (end == RunEnd::interrupted) {
    report_op_profile(recipe_, profile_, rank, reporter_.start_step(), fs_);
    return;
  }
  log_progress("done: {} steps in {}", recipe_.train.steps, format_duration(reporter_.elapsed_s()));
  if (comms_.pp->size() > 1 && !timer_.schedule_times().empty())  // every rank ran the same steps
    report_pipeline_idle(recipe_, micro_batches_, timer_, *comms_.control.pp);
  report_op_profile(recipe_, profile_, rank, reporter_.start_step(), fs_);
  log_offload_traffic(recipe_, step_);
  log_progress("memory per rank, peaks over the run: {}; peak of all kinds at once {}",
               format_memory(memory_measured(device_, true)), format_bytes(double(kernels::memory_use(device_).peak)));
}

}  // namespace llmtrain::trainer
